"""Example jobs on the mini-broker data source: a clickstream generator and a page-count
streaming job, wired together by `python -m pipeline.jobs.demo`."""
