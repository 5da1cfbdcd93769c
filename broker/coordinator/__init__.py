"""What the group and transaction coordinators share: records of their internal topics."""
