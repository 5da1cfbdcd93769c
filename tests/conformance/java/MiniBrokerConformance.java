import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collection;
import java.util.Collections;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeMap;
import java.util.TreeSet;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.Future;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AlterConfigOp;
import org.apache.kafka.clients.admin.AlterConfigsOptions;
import org.apache.kafka.clients.admin.AlterConsumerGroupOffsetsResult;
import org.apache.kafka.clients.admin.Config;
import org.apache.kafka.clients.admin.ConfigEntry;
import org.apache.kafka.clients.admin.ConsumerGroupDescription;
import org.apache.kafka.clients.admin.DescribeClusterResult;
import org.apache.kafka.clients.admin.DescribeConfigsOptions;
import org.apache.kafka.clients.admin.DescribeTopicsOptions;
import org.apache.kafka.clients.admin.ListOffsetsResult.ListOffsetsResultInfo;
import org.apache.kafka.clients.admin.LogDirDescription;
import org.apache.kafka.clients.admin.MemberDescription;
import org.apache.kafka.clients.admin.NewPartitions;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.admin.OffsetSpec;
import org.apache.kafka.clients.admin.RecordsToDelete;
import org.apache.kafka.clients.admin.ReplicaInfo;
import org.apache.kafka.clients.admin.TopicDescription;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.consumer.OffsetAndTimestamp;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.Node;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.TopicPartitionInfo;
import org.apache.kafka.common.config.ConfigResource;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.header.internals.RecordHeader;
import org.apache.kafka.common.utils.AppInfoParser;

/**
 * The reference Java client (kafka-clients) used as its users use it, against one broker.
 *
 * <p>Usage: {@code MiniBrokerConformance <bootstrap> <scenario>...}, a scenario being its name
 * and colon-separated arguments:
 * {@code version}, {@code roundtrip:<codec>:<topic>:<records file>},
 * {@code idempotent:<topic>:<partitions>:<records per partition>},
 * {@code timestamps:<topic>:<first timestamp ms>:<records>},
 * {@code group:<topic>:<group>:<partitions>:<records per partition>:<assignor>},
 * {@code admin:<name prefix>}, {@code txn:<topic>}, {@code fence:<topic>},
 * {@code txnOffsets:<input topic>:<output topic>:<group>}, {@code logAdmin:<name prefix>}.
 * One JVM runs several scenarios (a JVM start costs a second) and
 * prints one JSON line per scenario on stdout. The program reports what the client saw and
 * judges nothing: the Python test (tests/conformance/test_java.py) asserts on the lines. An
 * exception ends only its own scenario or step and is reported as {@code error}.
 */
public final class MiniBrokerConformance extends ClientSupport {
    public static void main(String[] args) {
        runAll(args, MiniBrokerConformance::run);
    }

    private static void run(String bootstrap, String[] a, Map<String, Object> out)
            throws Exception {
        switch (a[0]) {
            case "version" -> out.put("version", AppInfoParser.getVersion());
            case "roundtrip" -> roundtrip(bootstrap, a[1], a[2],
                    Path.of(String.join(":", List.of(a).subList(3, a.length))), out);
            case "idempotent" ->
                idempotent(bootstrap, a[1], Integer.parseInt(a[2]), Integer.parseInt(a[3]), out);
            case "timestamps" ->
                timestamps(bootstrap, a[1], Long.parseLong(a[2]), Integer.parseInt(a[3]), out);
            case "group" -> threeTwoLate(bootstrap, a[1], a[2], Integer.parseInt(a[3]),
                    Integer.parseInt(a[4]), a[5], MiniBrokerConformance::member,
                    MiniBrokerConformance::covers, Duration.ofSeconds(40), out);
            case "admin" -> admin(bootstrap, a[1], out);
            case "txn" -> txn(bootstrap, a[1], out);
            case "fence" -> fence(bootstrap, a[1], out);
            case "txnOffsets" -> txnOffsets(bootstrap, a[1], a[2], a[3], out);
            case "logAdmin" -> logAdmin(bootstrap, a[1], out);
            default -> throw new IllegalArgumentException("unknown scenario " + a[0]);
        }
    }

    // -- round trip --------------------------------------------------------------------------

    /**
     * Produces the records of a file (one per line, tab-separated tokens: timestamp, key, value,
     * then header key and value pairs; "-" is null, "=" + base64 is bytes) with one codec and
     * explicit CreateTime timestamps, then reads them all back with assign() from offset 0.
     */
    private static void roundtrip(String bootstrap, String codec, String topic, Path file,
                                  Map<String, Object> out) throws Exception {
        List<ProducerRecord<byte[], byte[]>> records = new ArrayList<>();
        for (String line : Files.readAllLines(file, StandardCharsets.UTF_8)) {
            String[] t = line.split("\t", -1);
            List<Header> headers = new ArrayList<>();
            for (int h = 3; h + 1 < t.length; h += 2) {
                headers.add(new RecordHeader(new String(Json.unbytes(t[h]), StandardCharsets.UTF_8),
                                             Json.unbytes(t[h + 1])));
            }
            records.add(new ProducerRecord<>(topic, 0, Long.parseLong(t[0]), Json.unbytes(t[1]),
                                             Json.unbytes(t[2]), headers));
        }
        createTopic(bootstrap, topic, 1);
        List<Object> acked = new ArrayList<>();
        try (KafkaProducer<byte[], byte[]> producer = producer(bootstrap, Map.of(
                "compression.type", codec, "acks", "all", "linger.ms", "20"))) {
            List<Future<RecordMetadata>> futures = new ArrayList<>();
            for (ProducerRecord<byte[], byte[]> r : records) futures.add(producer.send(r));
            producer.flush();
            for (Future<RecordMetadata> f : futures) {
                RecordMetadata m = f.get();
                acked.add(List.of(m.offset(), m.timestamp()));
            }
        }
        out.put("acked", acked);
        out.put("records", consumeAll(bootstrap, List.of(new TopicPartition(topic, 0)),
                                      records.size(), true));
    }

    /** Reads `count` records from the beginning of the partitions with assign(), no group. */
    private static List<Object> consumeAll(String bootstrap, List<TopicPartition> parts,
                                           int count, boolean full) {
        List<Object> got = new ArrayList<>();
        try (KafkaConsumer<byte[], byte[]> consumer = consumer(bootstrap, Map.of())) {
            consumer.assign(parts);
            consumer.seekToBeginning(parts);
            long deadline = System.nanoTime() + WAIT.toNanos();
            while (got.size() < count && System.nanoTime() < deadline) {
                for (ConsumerRecord<byte[], byte[]> r : consumer.poll(Duration.ofMillis(200))) {
                    got.add(full ? fullRecord(r) : List.of(r.partition(), r.offset(),
                                                           Json.bytes(r.value())));
                }
            }
            // Anything beyond `count` would be a duplicate: give it a moment to show up.
            for (ConsumerRecord<byte[], byte[]> r : consumer.poll(Duration.ofMillis(300))) {
                got.add(full ? fullRecord(r) : List.of(r.partition(), r.offset(),
                                                       Json.bytes(r.value())));
            }
        }
        return got;
    }

    private static List<Object> fullRecord(ConsumerRecord<byte[], byte[]> r) {
        List<Object> headers = new ArrayList<>();
        for (Header h : r.headers()) {
            headers.add(List.of(Json.bytes(h.key().getBytes(StandardCharsets.UTF_8)),
                                Json.bytes(h.value())));
        }
        return List.of(r.offset(), r.timestamp(), r.timestampType().name, Json.bytes(r.key()),
                       Json.bytes(r.value()), headers);
    }

    // -- idempotent producer -----------------------------------------------------------------

    /**
     * enable.idempotence with acks=all and five requests in flight; small batches, so several
     * are in flight per partition at once. Values are "partition:n".
     */
    private static void idempotent(String bootstrap, String topic, int partitions,
                                   int perPartition, Map<String, Object> out) throws Exception {
        createTopic(bootstrap, topic, partitions);
        List<Object> acked = Collections.synchronizedList(new ArrayList<>());
        List<String> failed = Collections.synchronizedList(new ArrayList<>());
        try (KafkaProducer<byte[], byte[]> producer = producer(bootstrap, Map.of(
                "enable.idempotence", "true", "acks", "all",
                "max.in.flight.requests.per.connection", "5", "linger.ms", "5",
                "batch.size", "512"))) {
            for (int n = 0; n < perPartition; n++) {
                for (int p = 0; p < partitions; p++) {
                    byte[] value = (p + ":" + n).getBytes(StandardCharsets.UTF_8);
                    producer.send(new ProducerRecord<>(topic, p, ("k" + n).getBytes(
                            StandardCharsets.UTF_8), value), (m, e) -> {
                                if (e != null) failed.add(describe(e));
                                else acked.add(List.of(m.partition(), m.offset(),
                                                       Json.bytes(value)));
                            });
                }
            }
            producer.flush();
        }
        out.put("acked", acked);
        out.put("failed", failed);
        List<TopicPartition> parts = new ArrayList<>();
        for (int p = 0; p < partitions; p++) parts.add(new TopicPartition(topic, p));
        out.put("consumed", consumeAll(bootstrap, parts, partitions * perPartition, false));
    }

    // -- seek by timestamp -------------------------------------------------------------------

    /**
     * `count` records with timestamps base + 1000 * i, five per batch; then offsetsForTimes for
     * targets before, on, between and after them, a seek to each answer and the first record
     * found there, and the Admin's listOffsets specs.
     */
    private static void timestamps(String bootstrap, String topic, long base, int count,
                                   Map<String, Object> out) throws Exception {
        createTopic(bootstrap, topic, 1);
        TopicPartition tp = new TopicPartition(topic, 0);
        try (KafkaProducer<byte[], byte[]> producer = producer(bootstrap, Map.of(
                "acks", "all", "linger.ms", "50"))) {
            for (int i = 0; i < count; i++) {
                producer.send(new ProducerRecord<>(topic, 0, base + 1000L * i, null,
                                                   ("t" + i).getBytes(StandardCharsets.UTF_8)));
                if (i % 5 == 4) producer.flush();
            }
            producer.flush();
        }
        List<Long> targets = new ArrayList<>(List.of(0L, base - 1, base, base + 1,
                base + 2500, base + 7000, base + 7001, base + 1000L * (count - 1),
                base + 1000L * (count - 1) + 1, base + 1000L * count + 60000));
        List<Object> answers = new ArrayList<>();
        try (KafkaConsumer<byte[], byte[]> consumer = consumer(bootstrap, Map.of())) {
            consumer.assign(List.of(tp));
            out.put("beginning", consumer.beginningOffsets(List.of(tp)).get(tp));
            out.put("end", consumer.endOffsets(List.of(tp)).get(tp));
            for (long target : targets) {
                OffsetAndTimestamp found = consumer.offsetsForTimes(Map.of(tp, target)).get(tp);
                Map<String, Object> row = new LinkedHashMap<>();
                row.put("target", target);
                row.put("offset", found == null ? null : found.offset());
                row.put("timestamp", found == null ? null : found.timestamp());
                if (found != null) {
                    consumer.seek(tp, found.offset());
                    ConsumerRecords<byte[], byte[]> recs = ConsumerRecords.empty();
                    long deadline = System.nanoTime() + WAIT.toNanos();
                    while (recs.isEmpty() && System.nanoTime() < deadline) {
                        recs = consumer.poll(Duration.ofMillis(200));
                    }
                    ConsumerRecord<byte[], byte[]> first = recs.isEmpty() ? null
                            : recs.records(tp).get(0);
                    row.put("first_offset", first == null ? null : first.offset());
                    row.put("first_timestamp", first == null ? null : first.timestamp());
                }
                answers.add(row);
            }
        }
        out.put("answers", answers);
        Map<String, Object> listed = new LinkedHashMap<>();
        try (Admin admin = admin(bootstrap)) {
            Map<String, OffsetSpec> specs = new LinkedHashMap<>();
            specs.put("earliest", OffsetSpec.earliest());
            specs.put("latest", OffsetSpec.latest());
            specs.put("maxTimestamp", OffsetSpec.maxTimestamp());
            specs.put("forTimestamp", OffsetSpec.forTimestamp(base + 2500));
            for (Map.Entry<String, OffsetSpec> s : specs.entrySet()) {
                listed.put(s.getKey(), step(() -> {
                    ListOffsetsResultInfo info = admin.listOffsets(Map.of(tp, s.getValue()))
                            .partitionResult(tp).get();
                    return List.of(info.offset(), info.timestamp());
                }));
            }
        }
        out.put("listOffsets", listed);
    }

    // -- consumer group ----------------------------------------------------------------------

    private static final Map<String, String> ASSIGNORS = Map.of(
            "range", "org.apache.kafka.clients.consumer.RangeAssignor",
            "cooperative-sticky", "org.apache.kafka.clients.consumer.CooperativeStickyAssignor");

    /**
     * A member of a classic group, as the Java consumer is used. `assignor`: range (eager
     * rebalances, a revocation empties the assignment), cooperative-sticky (incremental ones,
     * KIP-429) or default.
     */
    private static Member member(String bootstrap, String group, String topic, String name,
                                 Ledger ledger, String reset, String assignor) {
        Map<String, String> config = new HashMap<>(Map.of(
                "group.id", group, "group.protocol", "classic", "client.id", name,
                "session.timeout.ms", "10000", "heartbeat.interval.ms", "500",
                "auto.offset.reset", reset));
        if (!assignor.equals("default")) {
            config.put("partition.assignment.strategy", ASSIGNORS.get(assignor));
        }
        return new Member(bootstrap, topic, name, ledger, config, true);
    }

    /** Every member has partitions and each partition has one member. */
    private static boolean covers(List<Member> members, int partitions) {
        Set<Integer> all = new TreeSet<>();
        int total = 0;
        for (Member m : members) {
            if (m.assignment.isEmpty()) return false;
            all.addAll(m.assignment);
            total += m.assignment.size();
        }
        return all.size() == partitions && total == partitions;
    }

    // -- transactions ------------------------------------------------------------------------

    private static KafkaProducer<byte[], byte[]> transactional(String bootstrap, String id) {
        return producer(bootstrap, Map.of("transactional.id", id, "transaction.timeout.ms",
                                          "10000", "acks", "all", "linger.ms", "5"));
    }

    private static void sendValues(KafkaProducer<byte[], byte[]> producer, String topic,
                                   int partition, String prefix, int n) {
        for (int i = 0; i < n; i++) {
            producer.send(new ProducerRecord<>(topic, partition, null,
                                               (prefix + "-" + i).getBytes(StandardCharsets.UTF_8)));
        }
    }

    /** [offset, value] of every record up to `last` (a value), with one isolation level. */
    private static List<Object> readUntil(String bootstrap, TopicPartition tp, String isolation,
                                          String last) {
        List<Object> got = new ArrayList<>();
        try (KafkaConsumer<byte[], byte[]> consumer = consumer(bootstrap, Map.of(
                "isolation.level", isolation))) {
            consumer.assign(List.of(tp));
            consumer.seekToBeginning(List.of(tp));
            long deadline = System.nanoTime() + WAIT.toNanos();
            boolean done = false;
            while (!done && System.nanoTime() < deadline) {
                for (ConsumerRecord<byte[], byte[]> r : consumer.poll(Duration.ofMillis(200))) {
                    String v = new String(r.value(), StandardCharsets.UTF_8);
                    got.add(List.of(r.offset(), v));
                    done |= v.equals(last);
                }
            }
        }
        return got;
    }

    private static long endOffset(String bootstrap, TopicPartition tp, String isolation) {
        try (KafkaConsumer<byte[], byte[]> consumer = consumer(bootstrap, Map.of(
                "isolation.level", isolation))) {
            return consumer.endOffsets(List.of(tp)).get(tp);
        }
    }

    /**
     * Three transactions of five records: committed ("first"), aborted after a flush (its
     * records are in the log), committed ("last"); then what read_committed and
     * read_uncommitted consumers read, and the end offset each isolation level sees.
     */
    private static void txn(String bootstrap, String topic, Map<String, Object> out)
            throws Exception {
        createTopic(bootstrap, topic, 1);
        TopicPartition tp = new TopicPartition(topic, 0);
        try (KafkaProducer<byte[], byte[]> producer = transactional(bootstrap, topic + "-txn")) {
            producer.initTransactions();
            producer.beginTransaction();
            sendValues(producer, topic, 0, "first", 5);
            producer.commitTransaction();
            producer.beginTransaction();
            sendValues(producer, topic, 0, "aborted", 5);
            producer.flush();
            producer.abortTransaction();
            producer.beginTransaction();
            sendValues(producer, topic, 0, "last", 5);
            producer.commitTransaction();
        }
        out.put("readCommitted", readUntil(bootstrap, tp, "read_committed", "last-4"));
        out.put("readUncommitted", readUntil(bootstrap, tp, "read_uncommitted", "last-4"));
        out.put("endCommitted", endOffset(bootstrap, tp, "read_committed"));
        out.put("endUncommitted", endOffset(bootstrap, tp, "read_uncommitted"));
    }

    /**
     * A zombie: a producer with an open transaction whose transactional.id is initialised by a
     * second producer. The zombie's commitTransaction must fail (ProducerFencedException); the
     * second producer's transaction commits and is all a read_committed consumer reads.
     */
    private static void fence(String bootstrap, String topic, Map<String, Object> out)
            throws Exception {
        createTopic(bootstrap, topic, 1);
        String id = topic + "-txn";
        KafkaProducer<byte[], byte[]> zombie = transactional(bootstrap, id);
        try {
            zombie.initTransactions();
            zombie.beginTransaction();
            sendValues(zombie, topic, 0, "zombie", 3);
            zombie.flush();
            try (KafkaProducer<byte[], byte[]> fresh = transactional(bootstrap, id)) {
                fresh.initTransactions();
                out.put("zombieCommit", step(() -> {
                    zombie.commitTransaction();
                    return "committed";
                }));
                fresh.beginTransaction();
                sendValues(fresh, topic, 0, "fresh", 3);
                fresh.commitTransaction();
            }
        } finally {
            zombie.close(Duration.ofSeconds(5));
        }
        out.put("readCommitted", readUntil(bootstrap, new TopicPartition(topic, 0),
                                           "read_committed", "fresh-2"));
    }

    /**
     * Consume-transform-produce: a read_committed consumer in `group` reads the input (two
     * partitions of five records), the producer writes each value upper-cased and sends the
     * consumer's positions with its groupMetadata(); the group's committed offsets (Admin) are
     * recorded before and after the commit. A second round (three more records per partition)
     * is aborted, and the offsets recorded again; last, what read_committed reads of the output.
     */
    private static void txnOffsets(String bootstrap, String input, String output, String group,
                                   Map<String, Object> out) throws Exception {
        createTopic(bootstrap, input, 2);
        createTopic(bootstrap, output, 1);
        produceNumbered(bootstrap, input, 2, 5, "in");
        Map<String, Object> offsets = new LinkedHashMap<>();
        out.put("offsets", offsets);
        try (KafkaConsumer<byte[], byte[]> consumer = consumer(bootstrap, Map.of(
                     "group.id", group, "group.protocol", "classic",
                     "isolation.level", "read_committed", "session.timeout.ms", "10000"));
             KafkaProducer<byte[], byte[]> producer = transactional(bootstrap, group + "-txn");
             Admin admin = admin(bootstrap)) {
            consumer.subscribe(List.of(input));
            producer.initTransactions();
            for (String round : List.of("commit", "abort")) {
                if (round.equals("abort")) produceNumbered(bootstrap, input, 2, 3, "more");
                int want = round.equals("commit") ? 10 : 6;
                List<ConsumerRecord<byte[], byte[]>> got = new ArrayList<>();
                long deadline = System.nanoTime() + WAIT.toNanos();
                while (got.size() < want && System.nanoTime() < deadline) {
                    for (ConsumerRecord<byte[], byte[]> r : consumer.poll(Duration.ofMillis(200))) {
                        got.add(r);
                    }
                }
                offsets.put(round + "Consumed", got.size());
                producer.beginTransaction();
                Map<TopicPartition, OffsetAndMetadata> positions = new HashMap<>();
                for (ConsumerRecord<byte[], byte[]> r : got) {
                    producer.send(new ProducerRecord<>(output, 0, null, new String(
                            r.value(), StandardCharsets.UTF_8).toUpperCase().getBytes(
                            StandardCharsets.UTF_8)));
                    positions.put(new TopicPartition(r.topic(), r.partition()),
                                  new OffsetAndMetadata(r.offset() + 1));
                }
                producer.sendOffsetsToTransaction(positions, consumer.groupMetadata());
                producer.flush();
                offsets.put(round + "Before", groupOffsets(admin, group));
                if (round.equals("commit")) {
                    producer.commitTransaction();
                    waitFor(() -> {
                        try {
                            return groupOffsets(admin, group).size() == 2;
                        } catch (Exception e) {
                            return false;
                        }
                    }, Duration.ofSeconds(10));
                } else {
                    producer.abortTransaction();
                }
                offsets.put(round + "After", groupOffsets(admin, group));
            }
            producer.beginTransaction();
            producer.send(new ProducerRecord<>(output, 0, null,
                                               "END".getBytes(StandardCharsets.UTF_8)));
            producer.commitTransaction();
        }
        out.put("output", readUntil(bootstrap, new TopicPartition(output, 0), "read_committed",
                                    "END"));
    }

    // -- log admin ---------------------------------------------------------------------------

    private static final int COMPACT_KEYS = 20;
    private static final int COMPACT_UPDATES = 2000;
    private static final int PLAIN_RECORDS = 100;
    private static final int WIDE_PARTITIONS = 7;

    /**
     * The Admin calls that manage logs, each a step: incrementalAlterConfigs (SET, DELETE,
     * APPEND, SUBTRACT, validateOnly, a refused value; a topic and the broker, per broker and
     * cluster default) with describeConfigs and its synonyms; a topic made compacted that way,
     * written with COMPACT_UPDATES updates of COMPACT_KEYS keys and read back once cleaned;
     * deleteRecords (an offset, beyond the end, the high watermark, a compacted topic);
     * describeLogDirs; describeTopics by name with a partition limit per response, which the
     * client sends as DescribeTopicPartitions with a cursor.
     */
    private static void logAdmin(String bootstrap, String prefix, Map<String, Object> out)
            throws Exception {
        String compacted = prefix + "-compacted";
        String plain = prefix + "-plain";
        String wide = prefix + "-wide";
        Map<String, Object> steps = new LinkedHashMap<>();
        out.put("steps", steps);
        ConfigResource topicRes = new ConfigResource(ConfigResource.Type.TOPIC, compacted);
        ConfigResource wideRes = new ConfigResource(ConfigResource.Type.TOPIC, wide);
        try (Admin admin = admin(bootstrap)) {
            steps.put("createTopics", step(() -> {
                admin.createTopics(List.of(
                        new NewTopic(compacted, 1, (short) 1).configs(Map.of(
                                "segment.bytes", "16384", "segment.ms", "600000")),
                        new NewTopic(plain, 1, (short) 1),
                        new NewTopic(wide, WIDE_PARTITIONS, (short) 1))).all().get();
                return "ok";
            }));
            String node = String.valueOf(admin.describeCluster().controller().get().id());
            ConfigResource brokerRes = new ConfigResource(ConfigResource.Type.BROKER, node);
            ConfigResource clusterRes = new ConfigResource(ConfigResource.Type.BROKER, "");

            steps.put("alterTopic", step(() -> {
                alter(admin, topicRes, false,
                      set("cleanup.policy", "compact"), set("min.cleanable.dirty.ratio", "0.01"),
                      set("delete.retention.ms", "1000"), set("min.compaction.lag.ms", "0"));
                return configs(admin, topicRes, "cleanup.policy", "min.cleanable.dirty.ratio",
                               "delete.retention.ms", "min.compaction.lag.ms", "segment.bytes",
                               "max.compaction.lag.ms");
            }));
            steps.put("deleteTopicConfig", step(() -> {
                alter(admin, topicRes, false, new AlterConfigOp(
                        new ConfigEntry("delete.retention.ms", null), AlterConfigOp.OpType.DELETE));
                return configs(admin, topicRes, "delete.retention.ms");
            }));
            steps.put("validateOnly", step(() -> {
                alter(admin, topicRes, true, set("segment.ms", "1234"));
                return configs(admin, topicRes, "segment.ms");
            }));
            steps.put("invalidRatio", step(() -> {
                alter(admin, topicRes, false, set("min.cleanable.dirty.ratio", "2"));
                return "accepted";
            }));
            steps.put("lagAboveMax", step(() -> {
                alter(admin, topicRes, false, set("max.compaction.lag.ms", "1000"),
                      set("min.compaction.lag.ms", "5000"));
                return "accepted";
            }));
            steps.put("appendPolicy", step(() -> {
                alter(admin, wideRes, false, new AlterConfigOp(
                        new ConfigEntry("cleanup.policy", "compact"), AlterConfigOp.OpType.APPEND));
                return configs(admin, wideRes, "cleanup.policy");
            }));
            steps.put("subtractPolicy", step(() -> {
                alter(admin, wideRes, false, new AlterConfigOp(
                        new ConfigEntry("cleanup.policy", "delete"), AlterConfigOp.OpType.SUBTRACT));
                return configs(admin, wideRes, "cleanup.policy");
            }));
            steps.put("restorePolicy", step(() -> {
                alter(admin, wideRes, false, new AlterConfigOp(
                        new ConfigEntry("cleanup.policy", null), AlterConfigOp.OpType.DELETE));
                return configs(admin, wideRes, "cleanup.policy");
            }));
            steps.put("brokerStatic", step(() -> configs(admin, brokerRes,
                                                        "log.cleaner.backoff.ms")));
            steps.put("clusterDefault", step(() -> {
                alter(admin, clusterRes, false, set("log.cleaner.backoff.ms", "250"));
                return configs(admin, brokerRes, "log.cleaner.backoff.ms");
            }));
            steps.put("perBroker", step(() -> {
                alter(admin, brokerRes, false, set("log.cleaner.backoff.ms", "150"));
                return configs(admin, brokerRes, "log.cleaner.backoff.ms");
            }));
            steps.put("brokerReset", step(() -> {
                AlterConfigOp drop = new AlterConfigOp(
                        new ConfigEntry("log.cleaner.backoff.ms", null),
                        AlterConfigOp.OpType.DELETE);
                alter(admin, brokerRes, false, drop);
                alter(admin, clusterRes, false, drop);
                return configs(admin, brokerRes, "log.cleaner.backoff.ms");
            }));
            steps.put("readOnlyBrokerKey", step(() -> {
                alter(admin, brokerRes, false, set("log.dirs", "/nowhere"));
                return "accepted";
            }));

            steps.put("compacted", step(() -> compactAndRead(bootstrap, compacted)));

            TopicPartition plainTp = new TopicPartition(plain, 0);
            produceNumbered(bootstrap, plain, 1, PLAIN_RECORDS, "plain");
            steps.put("deleteRecords", step(() -> {
                long low = admin.deleteRecords(Map.of(plainTp, RecordsToDelete.beforeOffset(40)))
                        .lowWatermarks().get(plainTp).get().lowWatermark();
                long earliest = admin.listOffsets(Map.of(plainTp, OffsetSpec.earliest()))
                        .partitionResult(plainTp).get().offset();
                return List.of(low, earliest, firstOffset(bootstrap, plainTp));
            }));
            steps.put("deleteRecordsBeyondEnd", step(() -> admin.deleteRecords(Map.of(
                    plainTp, RecordsToDelete.beforeOffset(PLAIN_RECORDS + 50)))
                    .lowWatermarks().get(plainTp).get().lowWatermark()));
            steps.put("deleteRecordsCompacted", step(() -> {
                TopicPartition tp = new TopicPartition(compacted, 0);
                return admin.deleteRecords(Map.of(tp, RecordsToDelete.beforeOffset(1)))
                        .lowWatermarks().get(tp).get().lowWatermark();
            }));
            steps.put("deleteRecordsToHighWatermark", step(() -> admin.deleteRecords(Map.of(
                    plainTp, RecordsToDelete.beforeOffset(-1)))
                    .lowWatermarks().get(plainTp).get().lowWatermark()));

            steps.put("describeLogDirs", step(() -> {
                Map<String, Object> dirs = new TreeMap<>();
                Map<String, LogDirDescription> found = admin.describeLogDirs(
                        List.of(Integer.parseInt(node))).allDescriptions().get()
                        .get(Integer.parseInt(node));
                for (Map.Entry<String, LogDirDescription> d : found.entrySet()) {
                    LogDirDescription desc = d.getValue();
                    Map<String, Object> m = new LinkedHashMap<>();
                    m.put("error", desc.error() == null ? null : desc.error().getClass().getName());
                    m.put("totalBytes", desc.totalBytes().isPresent()
                            ? desc.totalBytes().getAsLong() : null);
                    m.put("usableBytes", desc.usableBytes().isPresent()
                            ? desc.usableBytes().getAsLong() : null);
                    Map<String, Object> replicas = new TreeMap<>();
                    for (Map.Entry<TopicPartition, ReplicaInfo> r : desc.replicaInfos().entrySet()) {
                        replicas.put(r.getKey().toString(), List.of(r.getValue().size(),
                                r.getValue().offsetLag(), r.getValue().isFuture()));
                    }
                    m.put("replicas", replicas);
                    dirs.put(d.getKey(), m);
                }
                return dirs;
            }));

            steps.put("describeTopicsPaged", step(() -> {
                Map<String, Object> m = new LinkedHashMap<>();
                TopicDescription d = admin.describeTopics(List.of(wide, plain),
                        new DescribeTopicsOptions().partitionSizeLimitPerResponse(3)
                                .includeAuthorizedOperations(true))
                        .allTopicNames().get().get(wide);
                List<Object> parts = new ArrayList<>();
                for (TopicPartitionInfo p : d.partitions()) {
                    parts.add(List.of(p.partition(), p.leader() == null ? -1 : p.leader().id(),
                                      p.replicas().size(), p.isr().size()));
                }
                m.put("partitions", parts);
                m.put("topicId", String.valueOf(d.topicId()));
                m.put("internal", d.isInternal());
                List<String> ops = new ArrayList<>();
                if (d.authorizedOperations() != null) {
                    d.authorizedOperations().forEach(op -> ops.add(op.name()));
                }
                Collections.sort(ops);
                m.put("authorizedOperations", d.authorizedOperations() == null ? null : ops);
                return m;
            }));
            steps.put("describeUnknownTopic", step(() -> describeTopics(
                    admin, List.of(prefix + "-missing"))));
        }
    }

    private static AlterConfigOp set(String name, String value) {
        return new AlterConfigOp(new ConfigEntry(name, value), AlterConfigOp.OpType.SET);
    }

    private static void alter(Admin admin, ConfigResource res, boolean validateOnly,
                              AlterConfigOp... ops) throws Exception {
        admin.incrementalAlterConfigs(Map.of(res, List.of(ops)),
                                      new AlterConfigsOptions().validateOnly(validateOnly))
                .all().get();
    }

    /** name -> [value, source, type, readOnly, [[synonym, value, source]...]] of some keys. */
    private static Map<String, Object> configs(Admin admin, ConfigResource res, String... names)
            throws Exception {
        Config config = admin.describeConfigs(List.of(res),
                new DescribeConfigsOptions().includeSynonyms(true)).all().get().get(res);
        Map<String, Object> out = new TreeMap<>();
        for (String name : names) {
            ConfigEntry e = config.get(name);
            if (e == null) {
                out.put(name, null);
                continue;
            }
            List<Object> synonyms = new ArrayList<>();
            for (ConfigEntry.ConfigSynonym s : e.synonyms()) {
                synonyms.add(Arrays.asList(s.name(), s.value(), s.source().name()));
            }
            out.put(name, Arrays.asList(e.value(), e.source().name(), e.type().name(),
                                        e.isReadOnly(), synonyms));
        }
        return out;
    }

    /** The offset of the first record a consumer reads from the beginning of `tp`. */
    private static long firstOffset(String bootstrap, TopicPartition tp) {
        try (KafkaConsumer<byte[], byte[]> consumer = consumer(bootstrap, Map.of())) {
            consumer.assign(List.of(tp));
            consumer.seekToBeginning(List.of(tp));
            long deadline = System.nanoTime() + WAIT.toNanos();
            while (System.nanoTime() < deadline) {
                for (ConsumerRecord<byte[], byte[]> r : consumer.poll(Duration.ofMillis(200))) {
                    return r.offset();
                }
            }
        }
        return -1;
    }

    /**
     * COMPACT_UPDATES updates over COMPACT_KEYS keys ("k<i>" -> "<n>"), CreateTime three hours
     * back, then one record ("roll") an hour later, which rolls the active segment past
     * segment.ms; then whole reads from the beginning until one has each key once, or WAIT.
     * Reports each key's last acknowledged [offset, value], the last read as [offset, key,
     * value] and how many reads it took.
     */
    private static Map<String, Object> compactAndRead(String bootstrap, String topic)
            throws Exception {
        TopicPartition tp = new TopicPartition(topic, 0);
        long base = System.currentTimeMillis() - 3 * 3600_000L;
        Map<String, Object> acked = new TreeMap<>();
        try (KafkaProducer<byte[], byte[]> producer = producer(bootstrap, Map.of(
                "acks", "all", "linger.ms", "5"))) {
            List<Future<RecordMetadata>> futures = new ArrayList<>();
            List<String[]> sent = new ArrayList<>();
            for (int n = 0; n < COMPACT_UPDATES; n++) {
                String key = "k" + ((n * 7) % COMPACT_KEYS);
                String value = String.valueOf(n);
                sent.add(new String[] {key, value});
                futures.add(producer.send(new ProducerRecord<>(topic, 0, base + n,
                        key.getBytes(StandardCharsets.UTF_8),
                        (value + "-" + "x".repeat(200)).getBytes(StandardCharsets.UTF_8))));
            }
            producer.flush(); // the roll record in a batch of its own, so it starts a segment
            sent.add(new String[] {"roll", "roll"});
            futures.add(producer.send(new ProducerRecord<>(topic, 0, base + 3600_000L,
                    "roll".getBytes(StandardCharsets.UTF_8),
                    "roll".getBytes(StandardCharsets.UTF_8))));
            producer.flush();
            for (int i = 0; i < futures.size(); i++) {
                String[] kv = sent.get(i);
                acked.put(kv[0], List.of(futures.get(i).get().offset(), kv[1]));
            }
        }
        List<Object> rows = new ArrayList<>();
        int reads = 0;
        long deadline = System.nanoTime() + 2 * WAIT.toNanos();
        try (KafkaConsumer<byte[], byte[]> consumer = consumer(bootstrap, Map.of())) {
            consumer.assign(List.of(tp));
            long end = consumer.endOffsets(List.of(tp)).get(tp);
            while (System.nanoTime() < deadline) {
                reads++;
                rows = new ArrayList<>();
                consumer.seekToBeginning(List.of(tp));
                long position = 0;
                while (position < end && System.nanoTime() < deadline) {
                    for (ConsumerRecord<byte[], byte[]> r : consumer.poll(Duration.ofMillis(200))) {
                        String v = new String(r.value(), StandardCharsets.UTF_8);
                        rows.add(List.of(r.offset(), new String(r.key(), StandardCharsets.UTF_8),
                                         v.split("-", 2)[0]));
                        position = r.offset() + 1;
                    }
                }
                if (rows.size() == COMPACT_KEYS + 1) break;
                Thread.sleep(200);
            }
        }
        Map<String, Object> m = new LinkedHashMap<>();
        m.put("acked", acked);
        m.put("rows", rows);
        m.put("reads", reads);
        return m;
    }

    // -- admin -------------------------------------------------------------------------------

    /**
     * The Admin client's topic, config, cluster and group calls, each a step with its own
     * result, so one call the broker answers differently does not hide the others.
     */
    private static void admin(String bootstrap, String prefix, Map<String, Object> out)
            throws Exception {
        String one = prefix + "-one";
        String two = prefix + "-two";
        String group = prefix + "-g";
        Map<String, Object> steps = new LinkedHashMap<>();
        out.put("steps", steps);
        try (Admin admin = admin(bootstrap)) {
            steps.put("createTopics", step(() -> {
                NewTopic withConfig = new NewTopic(two, 2, (short) 1).configs(Map.of(
                        "retention.ms", "3600000", "cleanup.policy", "delete"));
                admin.createTopics(List.of(new NewTopic(one, 1, (short) 1), withConfig))
                        .all().get();
                return "ok";
            }));
            steps.put("createTopicsAgain", step(() -> {
                admin.createTopics(List.of(new NewTopic(one, 1, (short) 1))).all().get();
                return "ok";
            }));
            steps.put("listTopics", step(() -> sorted(admin.listTopics().names().get())));
            steps.put("describeTopics", step(() -> describeTopics(admin, List.of(one, two))));
            steps.put("createPartitions", step(() -> {
                admin.createPartitions(Map.of(two, NewPartitions.increaseTo(4))).all().get();
                return describeTopics(admin, List.of(two));
            }));
            steps.put("describeConfigs", step(() -> {
                ConfigResource res = new ConfigResource(ConfigResource.Type.TOPIC, two);
                Config config = admin.describeConfigs(List.of(res)).all().get().get(res);
                Map<String, Object> entries = new TreeMap<>();
                for (ConfigEntry e : config.entries()) {
                    entries.put(e.name(), List.of(String.valueOf(e.value()), e.source().name(),
                                                  e.type().name()));
                }
                return entries;
            }));
            steps.put("describeBrokerConfigs", step(() -> {
                String id = String.valueOf(admin.describeCluster().controller().get().id());
                ConfigResource res = new ConfigResource(ConfigResource.Type.BROKER, id);
                Config config = admin.describeConfigs(List.of(res)).all().get().get(res);
                Map<String, Object> entries = new TreeMap<>();
                for (ConfigEntry e : config.entries()) entries.put(e.name(), e.value());
                return entries;
            }));
            steps.put("describeCluster", step(() -> {
                DescribeClusterResult c = admin.describeCluster();
                Map<String, Object> m = new LinkedHashMap<>();
                m.put("clusterId", c.clusterId().get());
                Node controller = c.controller().get();
                m.put("controller", controller == null ? null : controller.id());
                List<Object> nodes = new ArrayList<>();
                for (Node n : c.nodes().get()) nodes.add(List.of(n.id(), n.host(), n.port()));
                m.put("nodes", nodes);
                return m;
            }));

            // A live group: one member of `two` that has consumed and committed everything.
            produceNumbered(bootstrap, two, 4, 3, "admin");
            Ledger ledger = new Ledger();
            Member member = member(bootstrap, group, two, "admin-member", ledger, "earliest",
                                   "default");
            member.start();
            boolean consumed = waitFor(() -> ledger.has(4, 0, 3)
                    && member.assignment.size() == 4, Duration.ofSeconds(30));
            Thread.sleep(300); // its last commitSync
            steps.put("groupMember", Map.of("consumed", consumed, "report", member.report()));
            steps.put("listConsumerGroups", step(() -> listConsumerGroups(admin)));
            steps.put("listGroups", step(() -> listGroups(admin)));
            steps.put("describeConsumerGroups", step(() -> describeGroup(admin, group)));
            steps.put("listConsumerGroupOffsets", step(() -> groupOffsets(admin, group)));
            member.finish();
            steps.put("describeEmptyGroup", step(() -> describeGroup(admin, group)));
            steps.put("alterConsumerGroupOffsets", step(() -> {
                AlterConsumerGroupOffsetsResult r = admin.alterConsumerGroupOffsets(group, Map.of(
                        new TopicPartition(two, 0), new OffsetAndMetadata(1, "rewound")));
                r.all().get();
                return groupOffsets(admin, group);
            }));
            steps.put("deleteConsumerGroupOffsets", step(() -> {
                admin.deleteConsumerGroupOffsets(group, Set.of(new TopicPartition(two, 1)))
                        .all().get();
                return groupOffsets(admin, group);
            }));
            steps.put("deleteConsumerGroups", step(() -> {
                admin.deleteConsumerGroups(List.of(group)).all().get();
                return listConsumerGroups(admin);
            }));
            steps.put("deleteTopics", step(() -> {
                admin.deleteTopics(List.of(one, two)).all().get();
                return sorted(admin.listTopics().names().get());
            }));
            steps.put("describeDeletedTopic", step(() -> describeTopics(admin, List.of(one))));
        }
    }

    private static List<String> sorted(Collection<String> names) {
        List<String> out = new ArrayList<>(names);
        Collections.sort(out);
        return out;
    }

    private static Map<String, Object> describeTopics(Admin admin, List<String> topics)
            throws ExecutionException, InterruptedException {
        Map<String, Object> out = new TreeMap<>();
        for (TopicDescription d : admin.describeTopics(topics).allTopicNames().get().values()) {
            List<Object> parts = new ArrayList<>();
            for (TopicPartitionInfo p : d.partitions()) {
                parts.add(List.of(p.partition(), p.leader() == null ? -1 : p.leader().id(),
                                  p.replicas().size(), p.isr().size()));
            }
            Map<String, Object> m = new LinkedHashMap<>();
            m.put("internal", d.isInternal());
            m.put("topicId", String.valueOf(d.topicId()));
            m.put("partitions", parts);
            out.put(d.name(), m);
        }
        return out;
    }

    private static Map<String, Object> describeGroup(Admin admin, String group) throws Exception {
        ConsumerGroupDescription d = describeConsumerGroup(admin, group);
        Map<String, Object> out = groupSummary(d);
        List<Object> members = new ArrayList<>();
        for (MemberDescription m : d.members()) {
            List<Integer> parts = new ArrayList<>();
            for (TopicPartition tp : m.assignment().topicPartitions()) parts.add(tp.partition());
            Collections.sort(parts);
            Map<String, Object> mm = new LinkedHashMap<>();
            mm.put("clientId", m.clientId());
            mm.put("host", m.host());
            mm.put("memberIdSet", !m.consumerId().isEmpty());
            mm.put("partitions", parts);
            members.add(mm);
        }
        out.put("members", members);
        return out;
    }

    private static Map<String, Object> groupOffsets(Admin admin, String group) throws Exception {
        Map<String, Object> out = new TreeMap<>();
        admin.listConsumerGroupOffsets(group).partitionsToOffsetAndMetadata().get()
                .forEach((tp, om) -> out.put(tp.topic() + ":" + tp.partition(), om == null ? null
                        : Arrays.asList(om.offset(), om.metadata(),
                                        om.leaderEpoch().orElse(null))));
        return out;
    }
}
