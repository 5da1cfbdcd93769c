import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collection;
import java.util.Collections;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.TreeMap;
import java.util.TreeSet;
import java.util.concurrent.Callable;
import java.util.function.BooleanSupplier;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.ConsumerGroupDescription;
import org.apache.kafka.clients.admin.ConsumerGroupListing;
import org.apache.kafka.clients.admin.GroupListing;
import org.apache.kafka.clients.admin.ListGroupsOptions;
import org.apache.kafka.clients.admin.MemberAssignment;
import org.apache.kafka.clients.admin.MemberDescription;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.consumer.ConsumerRebalanceListener;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;
import org.apache.kafka.common.utils.AppInfoParser;

/**
 * The Java client's consumer group protocol (KIP-848, {@code group.protocol=consumer}) and its
 * client telemetry (KIP-714) against one broker.
 *
 * <p>Usage: {@code MiniBrokerConsumerProtocol <bootstrap> <scenario>...}, a scenario being its
 * name and colon-separated arguments: {@code version},
 * {@code group:<topic>:<group>:<partitions>:<records per partition>:<assignor>} (three members,
 * one leaves, a late one resumes), {@code admin:<topic>:<group>:<partitions>} (describe and
 * list a live group, then its Empty self), {@code telemetry:<topic>:<milliseconds>} (a producer and
 * a consumer with enable.metrics.push left at its default). One JSON line per scenario on
 * stdout; it reports what the client saw and judges nothing: the assertions are in
 * tests/conformance/test_java.py.
 */
public final class MiniBrokerConsumerProtocol {
    private static final Duration WAIT = Duration.ofSeconds(30);

    public static void main(String[] args) {
        String bootstrap = args[0];
        for (int i = 1; i < args.length; i++) {
            Map<String, Object> out = new LinkedHashMap<>();
            out.put("scenario", args[i]);
            long start = System.nanoTime();
            try {
                run(bootstrap, args[i].split(":", -1), out);
            } catch (Throwable e) {
                out.put("error", MiniBrokerConformance.describe(e));
            }
            out.put("seconds", (System.nanoTime() - start) / 1e9);
            System.out.println(Json.write(out));
            System.out.flush();
        }
    }

    private static void run(String bootstrap, String[] a, Map<String, Object> out)
            throws Exception {
        switch (a[0]) {
            case "version" -> out.put("version", AppInfoParser.getVersion());
            case "group" -> group(bootstrap, a[1], a[2], Integer.parseInt(a[3]),
                                  Integer.parseInt(a[4]), a[5], out);
            case "admin" -> admin(bootstrap, a[1], a[2], Integer.parseInt(a[3]), out);
            case "telemetry" -> telemetry(bootstrap, a[1], Long.parseLong(a[2]), out);
            default -> throw new IllegalArgumentException("unknown scenario " + a[0]);
        }
    }

    // -- clients ----------------------------------------------------------------------------

    private static Properties base(String bootstrap) {
        Properties p = new Properties();
        p.put("bootstrap.servers", bootstrap);
        p.put("request.timeout.ms", "10000");
        p.put("default.api.timeout.ms", "20000");
        return p;
    }

    private static KafkaProducer<byte[], byte[]> producer(String bootstrap) {
        Properties p = base(bootstrap);
        p.put("max.block.ms", "20000");
        p.put("delivery.timeout.ms", "30000");
        p.put("acks", "all");
        p.put("linger.ms", "5");
        return new KafkaProducer<>(p, new ByteArraySerializer(), new ByteArraySerializer());
    }

    private static KafkaConsumer<byte[], byte[]> consumer(String bootstrap, Map<String, String> c) {
        Properties p = base(bootstrap);
        p.put("enable.auto.commit", "false");
        p.put("auto.offset.reset", "earliest");
        p.put("fetch.max.wait.ms", "100");
        p.putAll(c);
        return new KafkaConsumer<>(p, new ByteArrayDeserializer(), new ByteArrayDeserializer());
    }

    private static void createTopic(String bootstrap, String topic, int partitions)
            throws Exception {
        try (Admin admin = Admin.create(base(bootstrap))) {
            admin.createTopics(List.of(new NewTopic(topic, partitions, (short) 1))).all().get();
        }
    }

    private static void produceNumbered(String bootstrap, String topic, int partitions,
                                        int perPartition, String phase) {
        try (KafkaProducer<byte[], byte[]> producer = producer(bootstrap)) {
            for (int n = 0; n < perPartition; n++) {
                for (int p = 0; p < partitions; p++) {
                    producer.send(new ProducerRecord<>(topic, p, null,
                            (phase + ":" + p + ":" + n).getBytes(StandardCharsets.UTF_8)));
                }
            }
            producer.flush();
        }
    }

    private static boolean waitFor(BooleanSupplier cond, Duration timeout)
            throws InterruptedException {
        long deadline = System.nanoTime() + timeout.toNanos();
        while (System.nanoTime() < deadline) {
            if (cond.getAsBoolean()) return true;
            Thread.sleep(50);
        }
        return cond.getAsBoolean();
    }

    /** A step's value, or {"error": ...}; never throws, so later steps still run. */
    private static Object step(Callable<Object> body) {
        Map<String, Object> out = new LinkedHashMap<>();
        try {
            out.put("value", body.call());
        } catch (Throwable e) {
            out.put("error", MiniBrokerConformance.describe(e));
        }
        return out;
    }

    // -- group members -----------------------------------------------------------------------

    /** Who consumed what, in processing order: [member, partition, offset, value]. */
    private static final class Ledger {
        private final List<List<Object>> rows = new ArrayList<>();

        synchronized void add(String member, ConsumerRecord<byte[], byte[]> r) {
            rows.add(List.of(member, r.partition(), r.offset(), Json.bytes(r.value())));
        }

        synchronized List<List<Object>> snapshot() {
            return new ArrayList<>(rows);
        }

        synchronized boolean has(int partitions, int from, int to) {
            Set<String> seen = new HashSet<>();
            for (List<Object> row : rows) seen.add(row.get(1) + "@" + row.get(2));
            for (int p = 0; p < partitions; p++) {
                for (int o = from; o < to; o++) if (!seen.contains(p + "@" + o)) return false;
            }
            return true;
        }
    }

    /**
     * One member of a consumer-protocol group in its own thread: subscribe, poll, process,
     * commitSync after each batch. The broker's assignor is chosen with group.remote.assignor;
     * sessions and heartbeats are the broker's (the client may not set them). Rebalances are
     * incremental, so the assignment is read from the consumer after a callback ran.
     */
    private static final class Member extends Thread {
        final String memberName;
        final KafkaConsumer<byte[], byte[]> consumer;
        final String topic;
        final Ledger ledger;
        final List<Object> assignments = Collections.synchronizedList(new ArrayList<>());
        final List<String> errors = Collections.synchronizedList(new ArrayList<>());
        volatile Set<Integer> assignment = Set.of();
        volatile String memberId = "";
        volatile boolean stop;
        private boolean changed;

        Member(String bootstrap, String group, String topic, String name, Ledger ledger,
               String reset, String assignor) {
            super(name);
            this.memberName = name;
            this.topic = topic;
            this.ledger = ledger;
            this.consumer = consumer(bootstrap, Map.of(
                    "group.id", group, "group.protocol", "consumer",
                    "group.remote.assignor", assignor, "client.id", name,
                    "auto.offset.reset", reset));
            setDaemon(true);
        }

        @Override
        public void run() {
            try {
                consumer.subscribe(List.of(topic), new ConsumerRebalanceListener() {
                    @Override
                    public void onPartitionsRevoked(Collection<TopicPartition> parts) {
                        changed = true;
                    }

                    @Override
                    public void onPartitionsAssigned(Collection<TopicPartition> parts) {
                        changed = true;
                    }
                });
                while (!stop) {
                    ConsumerRecords<byte[], byte[]> recs = consumer.poll(Duration.ofMillis(100));
                    if (changed) {
                        changed = false;
                        Set<Integer> now = new TreeSet<>();
                        for (TopicPartition tp : consumer.assignment()) now.add(tp.partition());
                        assignment = now;
                        memberId = consumer.groupMetadata().memberId();
                        assignments.add(new ArrayList<>(now));
                    }
                    for (ConsumerRecord<byte[], byte[]> r : recs) ledger.add(memberName, r);
                    if (!recs.isEmpty()) consumer.commitSync();
                }
            } catch (Throwable e) {
                errors.add(MiniBrokerConformance.describe(e));
            } finally {
                try {
                    consumer.close(); // leaves the group: a heartbeat with epoch -1
                } catch (Throwable e) {
                    errors.add("close: " + MiniBrokerConformance.describe(e));
                }
            }
        }

        Map<String, Object> report() {
            Map<String, Object> m = new LinkedHashMap<>();
            m.put("assignments", new ArrayList<>(assignments));
            m.put("errors", new ArrayList<>(errors));
            return m;
        }

        void finish() throws InterruptedException {
            stop = true;
            join(WAIT.toMillis());
            if (isAlive()) errors.add("did not stop");
            assignment = Set.of();
        }
    }

    private static List<Object> assignmentOf(List<Member> members) {
        List<Object> out = new ArrayList<>();
        for (Member m : members) out.add(new ArrayList<>(m.assignment));
        return out;
    }

    /** The members' assignments have these sizes and cover every partition between them. */
    private static boolean split(List<Member> members, int partitions, int each) {
        Set<Integer> all = new TreeSet<>();
        for (Member m : members) {
            if (m.assignment.size() != each) return false;
            all.addAll(m.assignment);
        }
        return all.size() == partitions;
    }

    /**
     * Three members share the partitions and commit; one leaves and the two others take its
     * partitions over; both stop; a new member with auto.offset.reset=none resumes exactly at
     * the committed offsets (it fails if any partition has none).
     */
    private static void group(String bootstrap, String topic, String group, int partitions,
                              int perPartition, String assignor, Map<String, Object> out)
            throws Exception {
        createTopic(bootstrap, topic, partitions);
        Ledger ledger = new Ledger();
        Map<String, Object> phases = new LinkedHashMap<>();
        out.put("phases", phases);
        List<Member> all = new ArrayList<>();
        try {
            produceNumbered(bootstrap, topic, partitions, perPartition, "one");
            List<Member> three = new ArrayList<>();
            for (int i = 0; i < 3; i++) {
                three.add(new Member(bootstrap, group, topic, "member-" + i, ledger, "earliest",
                                     assignor));
            }
            all.addAll(three);
            three.forEach(Thread::start);
            boolean done = waitFor(() -> ledger.has(partitions, 0, perPartition)
                    && split(three, partitions, partitions / 3), WAIT);
            phases.put("three", Map.of("complete", done, "assignment", assignmentOf(three)));

            three.get(2).finish(); // leaves the group
            List<Member> two = three.subList(0, 2);
            produceNumbered(bootstrap, topic, partitions, perPartition, "two");
            done = waitFor(() -> ledger.has(partitions, 0, 2 * perPartition)
                    && split(two, partitions, partitions / 2), WAIT);
            phases.put("two", Map.of("complete", done, "assignment", assignmentOf(two)));
            for (Member m : two) m.finish();

            produceNumbered(bootstrap, topic, partitions, perPartition, "three");
            Member late = new Member(bootstrap, group, topic, "late", ledger, "none", assignor);
            all.add(late);
            late.start();
            done = waitFor(() -> ledger.has(partitions, 0, 3 * perPartition), WAIT);
            Thread.sleep(300); // a re-read of anything older would show up by now
            late.finish();
            phases.put("late", Map.of("complete", done));
        } finally {
            for (Member m : all) {
                if (m.isAlive()) m.finish();
            }
            out.put("rows", ledger.snapshot());
            Map<String, Object> members = new LinkedHashMap<>();
            for (Member m : all) members.put(m.memberName, m.report());
            out.put("members", members);
        }
        try (Admin admin = Admin.create(base(bootstrap))) {
            Map<String, Object> committed = new TreeMap<>();
            admin.listConsumerGroupOffsets(group).partitionsToOffsetAndMetadata().get()
                    .forEach((tp, om) -> committed.put(String.valueOf(tp.partition()),
                                                       om == null ? null : om.offset()));
            out.put("committed", committed);
        }
    }

    // -- admin -------------------------------------------------------------------------------

    /**
     * Two members (uniform) of a consumer-protocol group: describeConsumerGroups, listGroups
     * and listConsumerGroups while it is Stable, each a step of its own; then both leave and the
     * Empty group is described.
     */
    private static void admin(String bootstrap, String topic, String group, int partitions,
                              Map<String, Object> out) throws Exception {
        createTopic(bootstrap, topic, partitions);
        Map<String, Object> steps = new LinkedHashMap<>();
        out.put("steps", steps);
        Ledger ledger = new Ledger();
        List<Member> members = List.of(
                new Member(bootstrap, group, topic, "admin-0", ledger, "earliest", "uniform"),
                new Member(bootstrap, group, topic, "admin-1", ledger, "earliest", "uniform"));
        try (Admin admin = Admin.create(base(bootstrap))) {
            members.forEach(Thread::start);
            boolean split = waitFor(() -> split(members, partitions, partitions / 2), WAIT);
            Map<String, Object> ids = new TreeMap<>();
            for (Member m : members) ids.put(m.memberName, m.memberId);
            steps.put("members", Map.of("split", split, "assignment", assignmentOf(members),
                                        "memberIds", ids));
            steps.put("describeConsumerGroups", step(() -> describeGroup(admin, group)));
            steps.put("listGroups", step(() -> listGroups(admin)));
            steps.put("listConsumerGroups", step(() -> listConsumerGroups(admin)));
            for (Member m : members) m.finish();
            Map<String, Object> reports = new LinkedHashMap<>();
            for (Member m : members) reports.put(m.memberName, m.report());
            steps.put("reports", reports);
            steps.put("describeEmptyGroup", step(() -> describeGroup(admin, group)));
        } finally {
            for (Member m : members) {
                if (m.isAlive()) m.finish();
            }
        }
    }

    private static List<String> partitionsOf(MemberAssignment a) {
        List<String> out = new ArrayList<>();
        for (TopicPartition tp : a.topicPartitions()) out.add(tp.toString());
        Collections.sort(out);
        return out;
    }

    private static Map<String, Object> describeGroup(Admin admin, String group) throws Exception {
        ConsumerGroupDescription d = admin.describeConsumerGroups(List.of(group))
                .describedGroups().get(group).get();
        Map<String, Object> out = new LinkedHashMap<>();
        out.put("state", String.valueOf(d.groupState()));
        out.put("type", String.valueOf(d.type()));
        out.put("assignor", d.partitionAssignor());
        out.put("coordinator", d.coordinator() == null ? null : d.coordinator().id());
        out.put("simple", d.isSimpleConsumerGroup());
        out.put("groupEpoch", d.groupEpoch().orElse(null));
        out.put("targetAssignmentEpoch", d.targetAssignmentEpoch().orElse(null));
        List<Object> members = new ArrayList<>();
        for (MemberDescription m : d.members()) {
            Map<String, Object> mm = new LinkedHashMap<>();
            mm.put("clientId", m.clientId());
            mm.put("memberId", m.consumerId());
            mm.put("host", m.host());
            mm.put("memberEpoch", m.memberEpoch().orElse(null));
            mm.put("upgraded", m.upgraded().orElse(null));
            mm.put("partitions", partitionsOf(m.assignment()));
            mm.put("target", m.targetAssignment().map(MiniBrokerConsumerProtocol::partitionsOf)
                    .orElse(null));
            members.add(mm);
        }
        members.sort((x, y) -> String.valueOf(((Map<?, ?>) x).get("clientId"))
                .compareTo(String.valueOf(((Map<?, ?>) y).get("clientId"))));
        out.put("members", members);
        return out;
    }

    /** ListGroups filtered on the consumer group types: [state, type, protocol type]. */
    private static Map<String, Object> listGroups(Admin admin) throws Exception {
        Map<String, Object> out = new TreeMap<>();
        for (GroupListing g : admin.listGroups(ListGroupsOptions.forConsumerGroups()).all().get()) {
            out.put(g.groupId(), List.of(String.valueOf(g.groupState().orElse(null)),
                                         String.valueOf(g.type().orElse(null)), g.protocol()));
        }
        return out;
    }

    /** Deprecated for removal in 4.x, yet still the call most code in the field makes. */
    @SuppressWarnings("removal")
    private static Map<String, Object> listConsumerGroups(Admin admin) throws Exception {
        Map<String, Object> out = new TreeMap<>();
        for (ConsumerGroupListing g : admin.listConsumerGroups().all().get()) {
            out.put(g.groupId(), List.of(String.valueOf(g.groupState().orElse(null)),
                                         String.valueOf(g.type().orElse(null))));
        }
        return out;
    }

    // -- telemetry ---------------------------------------------------------------------------

    /**
     * A producer sending a record every 50 ms for `millis` and a consumer reading them (assign,
     * no group), both with enable.metrics.push at its default (true): each asks for its
     * telemetry subscription, pushes what it is asked for, and asks again when asked for
     * nothing. Reports the client instance ids the broker gave them (clientInstanceId) and how
     * many records were produced and read.
     */
    private static void telemetry(String bootstrap, String topic, long millis,
                                  Map<String, Object> out) throws Exception {
        createTopic(bootstrap, topic, 1);
        TopicPartition tp = new TopicPartition(topic, 0);
        int sent = 0;
        int read = 0;
        try (KafkaProducer<byte[], byte[]> producer = producer(bootstrap);
             KafkaConsumer<byte[], byte[]> consumer = consumer(bootstrap, Map.of())) {
            consumer.assign(List.of(tp));
            consumer.seekToBeginning(List.of(tp));
            long end = System.nanoTime() + Duration.ofMillis(millis).toNanos();
            while (System.nanoTime() < end) {
                producer.send(new ProducerRecord<>(topic, 0, null,
                        ("t" + sent).getBytes(StandardCharsets.UTF_8))).get();
                sent++;
                read += consumer.poll(Duration.ofMillis(50)).count();
                Thread.sleep(50);
            }
            long deadline = System.nanoTime() + WAIT.toNanos();
            while (read < sent && System.nanoTime() < deadline) {
                read += consumer.poll(Duration.ofMillis(100)).count();
            }
            out.put("producerInstanceId", step(() -> String.valueOf(
                    producer.clientInstanceId(Duration.ofSeconds(10)))));
            out.put("consumerInstanceId", step(() -> String.valueOf(
                    consumer.clientInstanceId(Duration.ofSeconds(10)))));
        }
        out.put("sent", sent);
        out.put("read", read);
    }
}
