import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeMap;
import java.util.TreeSet;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.ConsumerGroupDescription;
import org.apache.kafka.clients.admin.MemberAssignment;
import org.apache.kafka.clients.admin.MemberDescription;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.TopicPartition;
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
public final class MiniBrokerConsumerProtocol extends ClientSupport {
    public static void main(String[] args) {
        runAll(args, MiniBrokerConsumerProtocol::run);
    }

    private static void run(String bootstrap, String[] a, Map<String, Object> out)
            throws Exception {
        switch (a[0]) {
            case "version" -> out.put("version", AppInfoParser.getVersion());
            case "group" -> threeTwoLate(bootstrap, a[1], a[2], Integer.parseInt(a[3]),
                    Integer.parseInt(a[4]), a[5], MiniBrokerConsumerProtocol::member,
                    (ms, p) -> split(ms, p, p / ms.size()), WAIT, out);
            case "admin" -> admin(bootstrap, a[1], a[2], Integer.parseInt(a[3]), out);
            case "telemetry" -> telemetry(bootstrap, a[1], Long.parseLong(a[2]), out);
            default -> throw new IllegalArgumentException("unknown scenario " + a[0]);
        }
    }

    // -- group members -----------------------------------------------------------------------

    /**
     * A member of a consumer-protocol group: the broker's assignor is chosen with
     * group.remote.assignor; sessions and heartbeats are the broker's (the client may not set
     * them). Rebalances are incremental, so a revocation is read from the consumer too.
     */
    private static Member member(String bootstrap, String group, String topic, String name,
                                 Ledger ledger, String reset, String assignor) {
        return new Member(bootstrap, topic, name, ledger, Map.of(
                "group.id", group, "group.protocol", "consumer",
                "group.remote.assignor", assignor, "client.id", name,
                "auto.offset.reset", reset), false);
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
                member(bootstrap, group, topic, "admin-0", ledger, "earliest", "uniform"),
                member(bootstrap, group, topic, "admin-1", ledger, "earliest", "uniform"));
        try (Admin admin = admin(bootstrap)) {
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
        ConsumerGroupDescription d = describeConsumerGroup(admin, group);
        Map<String, Object> out = groupSummary(d);
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
        try (KafkaProducer<byte[], byte[]> producer = producer(bootstrap, Map.of(
                     "acks", "all", "linger.ms", "5"));
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