import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collection;
import java.util.Collections;
import java.util.HashMap;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.TreeMap;
import java.util.TreeSet;
import java.util.concurrent.Callable;
import java.util.concurrent.ExecutionException;
import java.util.function.BiPredicate;
import java.util.function.BooleanSupplier;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.ConsumerGroupDescription;
import org.apache.kafka.clients.admin.ConsumerGroupListing;
import org.apache.kafka.clients.admin.GroupListing;
import org.apache.kafka.clients.admin.ListGroupsOptions;
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

/**
 * What the conformance programs (MiniBrokerConformance, MiniBrokerConsumerProtocol,
 * MiniBrokerSecurity) share: the scenario loop and its JSON lines, clients with short timeouts,
 * and the group members whose consumption they report. The programs extend it only to call
 * these static helpers by their short names (the unnamed package cannot be imported from).
 */
abstract class ClientSupport {
    static final Duration WAIT = Duration.ofSeconds(30);

    ClientSupport() {}

    // -- scenarios ---------------------------------------------------------------------------

    /** One scenario: its colon-separated name and arguments in, what the client saw into out. */
    interface Scenario {
        void run(String bootstrap, String[] args, Map<String, Object> out) throws Exception;
    }

    /**
     * Runs each scenario named after the bootstrap address in order and prints one JSON line
     * for each; an exception ends only its own scenario and is reported as {@code error}.
     */
    static void runAll(String[] args, Scenario scenario) {
        String bootstrap = args[0];
        for (int i = 1; i < args.length; i++) {
            Map<String, Object> out = new LinkedHashMap<>();
            out.put("scenario", args[i]);
            long start = System.nanoTime();
            try {
                scenario.run(bootstrap, args[i].split(":", -1), out);
            } catch (Throwable e) {
                out.put("error", describe(e));
            }
            out.put("seconds", (System.nanoTime() - start) / 1e9);
            System.out.println(Json.write(out));
            System.out.flush();
        }
    }

    /** A step's value, or {"error": ...}; never throws, so later steps still run. */
    static Object step(Callable<Object> body) {
        Map<String, Object> out = new LinkedHashMap<>();
        try {
            out.put("value", body.call());
        } catch (Throwable e) {
            out.put("error", describe(e));
        }
        return out;
    }

    /** "Class: message" down the cause chain, with ExecutionException wrappers peeled off. */
    static String describe(Throwable e) {
        StringBuilder sb = new StringBuilder();
        Map<Throwable, Boolean> seen = new HashMap<>();
        for (Throwable t = e; t != null && seen.put(t, true) == null; t = t.getCause()) {
            if (t instanceof ExecutionException && t.getCause() != null) continue;
            if (sb.length() > 0) sb.append(" <- ");
            sb.append(t.getClass().getName()).append(": ").append(t.getMessage());
        }
        return sb.toString();
    }

    static boolean waitFor(BooleanSupplier cond, Duration timeout) throws InterruptedException {
        long deadline = System.nanoTime() + timeout.toNanos();
        while (System.nanoTime() < deadline) {
            if (cond.getAsBoolean()) return true;
            Thread.sleep(50);
        }
        return cond.getAsBoolean();
    }

    // -- clients ----------------------------------------------------------------------------

    /** Timeouts shorter than the defaults (30-120 s), so a broker that never answers fails fast. */
    static Properties base(String bootstrap) {
        Properties p = new Properties();
        p.put("bootstrap.servers", bootstrap);
        p.put("request.timeout.ms", "10000");
        p.put("default.api.timeout.ms", "20000");
        return p;
    }

    static KafkaProducer<byte[], byte[]> producer(String bootstrap, Map<String, String> c) {
        Properties p = base(bootstrap);
        p.put("max.block.ms", "20000");
        p.put("delivery.timeout.ms", "30000");
        p.putAll(c);
        return new KafkaProducer<>(p, new ByteArraySerializer(), new ByteArraySerializer());
    }

    static KafkaConsumer<byte[], byte[]> consumer(String bootstrap, Map<String, String> c) {
        Properties p = base(bootstrap);
        p.put("enable.auto.commit", "false");
        p.put("auto.offset.reset", "earliest");
        p.put("fetch.max.wait.ms", "100");
        p.putAll(c);
        return new KafkaConsumer<>(p, new ByteArrayDeserializer(), new ByteArrayDeserializer());
    }

    static Admin admin(String bootstrap) {
        return Admin.create(base(bootstrap));
    }

    static void createTopic(String bootstrap, String topic, int partitions) throws Exception {
        try (Admin admin = admin(bootstrap)) {
            admin.createTopics(List.of(new NewTopic(topic, partitions, (short) 1))).all().get();
        }
    }

    /** `perPartition` records on each partition, valued "phase:partition:n". */
    static void produceNumbered(String bootstrap, String topic, int partitions, int perPartition,
                                String phase) {
        try (KafkaProducer<byte[], byte[]> producer = producer(bootstrap, Map.of(
                "acks", "all", "linger.ms", "5"))) {
            for (int n = 0; n < perPartition; n++) {
                for (int p = 0; p < partitions; p++) {
                    producer.send(new ProducerRecord<>(topic, p, null,
                            (phase + ":" + p + ":" + n).getBytes(StandardCharsets.UTF_8)));
                }
            }
            producer.flush();
        }
    }

    // -- group members -----------------------------------------------------------------------

    /** Who consumed what, in the order it was processed: [member, partition, offset, value]. */
    static final class Ledger {
        private final List<List<Object>> rows = new ArrayList<>();

        synchronized void add(String member, ConsumerRecord<byte[], byte[]> r) {
            rows.add(List.of(member, r.partition(), r.offset(), Json.bytes(r.value())));
        }

        synchronized List<List<Object>> snapshot() {
            return new ArrayList<>(rows);
        }

        /** Whether offsets from..to-1 of every partition have been consumed. */
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
     * One group member in its own thread, as the Java consumer is used: subscribe, poll,
     * process, commitSync after each batch. Partitions are revoked only inside poll(), so every
     * processed record is committed before a rebalance can hand its partition to another
     * member. Incremental rebalances (the cooperative assignor, the consumer group protocol)
     * carry only what changed, so the whole assignment is read from the consumer after a
     * callback ran. With `clearOnRevoke` (the classic protocol) a revocation empties the
     * assignment at once; otherwise it is read again like an assignment.
     */
    static final class Member extends Thread {
        final String memberName;
        final KafkaConsumer<byte[], byte[]> consumer;
        final String topic;
        final Ledger ledger;
        final boolean clearOnRevoke;
        final List<Object> assignments = Collections.synchronizedList(new ArrayList<>());
        final List<String> errors = Collections.synchronizedList(new ArrayList<>());
        volatile Set<Integer> assignment = Set.of();
        volatile String memberId = "";
        volatile boolean stop;
        private boolean changed;

        Member(String bootstrap, String topic, String name, Ledger ledger,
               Map<String, String> config, boolean clearOnRevoke) {
            super(name);
            this.memberName = name;
            this.topic = topic;
            this.ledger = ledger;
            this.clearOnRevoke = clearOnRevoke;
            this.consumer = consumer(bootstrap, config);
            setDaemon(true);
        }

        @Override
        public void run() {
            try {
                consumer.subscribe(List.of(topic), new ConsumerRebalanceListener() {
                    @Override
                    public void onPartitionsRevoked(Collection<TopicPartition> parts) {
                        if (!clearOnRevoke) changed = true;
                        else if (!parts.isEmpty()) assignment = Set.of();
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
                errors.add(describe(e));
            } finally {
                try {
                    consumer.close(); // leaves the group (LeaveGroup, or a heartbeat at epoch -1)
                } catch (Throwable e) {
                    errors.add("close: " + describe(e));
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

    /** A new member of a group, with its client name, ledger, auto.offset.reset and assignor. */
    interface MemberFactory {
        Member create(String bootstrap, String group, String topic, String name, Ledger ledger,
                      String reset, String assignor);
    }

    static List<Object> assignmentOf(List<Member> members) {
        List<Object> out = new ArrayList<>();
        for (Member m : members) out.add(new ArrayList<>(m.assignment));
        return out;
    }

    /**
     * Three members share the partitions and commit; one leaves and the two others take its
     * partitions over; both stop; a new member with auto.offset.reset=none resumes exactly at
     * the committed offsets (it fails if any partition has none). Each phase waits up to
     * `timeout` for its records and (but the last) for `balanced(members, partitions)`.
     */
    static void threeTwoLate(String bootstrap, String topic, String group, int partitions,
                             int perPartition, String assignor, MemberFactory members,
                             BiPredicate<List<Member>, Integer> balanced, Duration timeout,
                             Map<String, Object> out) throws Exception {
        createTopic(bootstrap, topic, partitions);
        Ledger ledger = new Ledger();
        Map<String, Object> phases = new LinkedHashMap<>();
        out.put("phases", phases);
        List<Member> all = new ArrayList<>();
        try {
            produceNumbered(bootstrap, topic, partitions, perPartition, "one");
            List<Member> three = new ArrayList<>();
            for (int i = 0; i < 3; i++) {
                three.add(members.create(bootstrap, group, topic, "member-" + i, ledger,
                                          "earliest", assignor));
            }
            all.addAll(three);
            three.forEach(Thread::start);
            boolean done = waitFor(() -> ledger.has(partitions, 0, perPartition)
                    && balanced.test(three, partitions), timeout);
            phases.put("three", Map.of("complete", done, "assignment", assignmentOf(three)));

            three.get(2).finish(); // leaves the group
            List<Member> two = three.subList(0, 2);
            produceNumbered(bootstrap, topic, partitions, perPartition, "two");
            done = waitFor(() -> ledger.has(partitions, 0, 2 * perPartition)
                    && balanced.test(two, partitions), timeout);
            phases.put("two", Map.of("complete", done, "assignment", assignmentOf(two)));
            for (Member m : two) m.finish();

            produceNumbered(bootstrap, topic, partitions, perPartition, "three");
            Member late = members.create(bootstrap, group, topic, "late", ledger, "none",
                                         assignor);
            all.add(late);
            late.start();
            done = waitFor(() -> ledger.has(partitions, 0, 3 * perPartition), timeout);
            Thread.sleep(300); // a re-read of anything older would show up by now
            late.finish();
            phases.put("late", Map.of("complete", done));
        } finally {
            for (Member m : all) {
                if (m.isAlive()) m.finish();
            }
            out.put("rows", ledger.snapshot());
            Map<String, Object> reports = new LinkedHashMap<>();
            for (Member m : all) reports.put(m.memberName, m.report());
            out.put("members", reports);
        }
        try (Admin admin = admin(bootstrap)) {
            Map<String, Object> committed = new TreeMap<>();
            admin.listConsumerGroupOffsets(group).partitionsToOffsetAndMetadata().get()
                    .forEach((tp, om) -> committed.put(String.valueOf(tp.partition()),
                                                       om == null ? null : om.offset()));
            out.put("committed", committed);
        }
    }

    // -- admin -------------------------------------------------------------------------------

    /** describeConsumerGroups of one group. */
    static ConsumerGroupDescription describeConsumerGroup(Admin admin, String group)
            throws Exception {
        return admin.describeConsumerGroups(List.of(group)).describedGroups().get(group).get();
    }

    /** What every description reports of a group as a whole, before its own fields. */
    static Map<String, Object> groupSummary(ConsumerGroupDescription d) {
        Map<String, Object> out = new LinkedHashMap<>();
        out.put("state", String.valueOf(d.groupState()));
        out.put("type", String.valueOf(d.type()));
        out.put("assignor", d.partitionAssignor());
        out.put("coordinator", d.coordinator() == null ? null : d.coordinator().id());
        out.put("simple", d.isSimpleConsumerGroup());
        return out;
    }

    /** Deprecated for removal in 4.x, yet still the call most code in the field makes. */
    @SuppressWarnings("removal")
    static Map<String, Object> listConsumerGroups(Admin admin) throws Exception {
        Map<String, Object> out = new TreeMap<>();
        for (ConsumerGroupListing g : admin.listConsumerGroups().all().get()) {
            out.put(g.groupId(), List.of(String.valueOf(g.groupState().orElse(null)),
                                         String.valueOf(g.type().orElse(null))));
        }
        return out;
    }

    /** Its replacement: ListGroups filtered on the consumer group types. */
    static Map<String, Object> listGroups(Admin admin) throws Exception {
        Map<String, Object> out = new TreeMap<>();
        for (GroupListing g : admin.listGroups(ListGroupsOptions.forConsumerGroups()).all().get()) {
            out.put(g.groupId(), List.of(String.valueOf(g.groupState().orElse(null)),
                                         String.valueOf(g.type().orElse(null)), g.protocol()));
        }
        return out;
    }
}
