import java.io.IOException;
import java.io.Reader;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collection;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.TreeMap;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.acl.AccessControlEntry;
import org.apache.kafka.common.acl.AccessControlEntryFilter;
import org.apache.kafka.common.acl.AclBinding;
import org.apache.kafka.common.acl.AclBindingFilter;
import org.apache.kafka.common.acl.AclOperation;
import org.apache.kafka.common.acl.AclPermissionType;
import org.apache.kafka.common.resource.PatternType;
import org.apache.kafka.common.resource.ResourcePattern;
import org.apache.kafka.common.resource.ResourcePatternFilter;
import org.apache.kafka.common.resource.ResourceType;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;

/**
 * The Java client against an authenticated broker: each identity is a client properties file
 * (security.protocol, sasl.mechanism, sasl.jaas.config, ssl.truststore.*), as Java users
 * configure it; the bootstrap address comes first on the command line.
 *
 * <p>Usage: {@code MiniBrokerSecurity <bootstrap> <scenario>...}, a scenario being its name
 * and colon-separated arguments:
 * {@code createTopic:<props>:<topic>:<partitions>},
 * {@code acls:<props>:<user>:<prefix>} (create, describe, delete and describe again),
 * {@code roundtrip:<props>:<topic>:<group>:<records>} (produce, then consume in a group that
 * commits), {@code denied:<props>:<topic>} (a produce and an ACL change that must be refused).
 * One JSON line per scenario on stdout; the assertions are in tests/conformance/test_java.py.
 */
public final class MiniBrokerSecurity extends ClientSupport {
    public static void main(String[] args) {
        runAll(args, MiniBrokerSecurity::run);
    }

    private static void run(String bootstrap, String[] a, Map<String, Object> out)
            throws Exception {
        Properties p = load(bootstrap, Path.of(a[1]));
        switch (a[0]) {
            case "createTopic" -> {
                try (Admin admin = Admin.create(p)) {
                    admin.createTopics(List.of(new NewTopic(a[2], Integer.parseInt(a[3]),
                                                            (short) 1))).all().get();
                }
                out.put("created", a[2]);
            }
            case "acls" -> acls(p, a[2], a[3], out);
            case "roundtrip" -> roundtrip(p, a[2], a[3], Integer.parseInt(a[4]), out);
            case "denied" -> denied(p, a[2], out);
            default -> throw new IllegalArgumentException("unknown scenario " + a[0]);
        }
    }

    /** The identity's properties file, with the bootstrap address and short timeouts added. */
    private static Properties load(String bootstrap, Path file) throws IOException {
        Properties p = new Properties();
        try (Reader r = Files.newBufferedReader(file, StandardCharsets.UTF_8)) {
            p.load(r);
        }
        p.putAll(base(bootstrap));
        return p;
    }

    private static List<String> text(Collection<AclBinding> bindings) {
        List<String> rows = new ArrayList<>();
        for (AclBinding b : bindings) {
            ResourcePattern r = b.pattern();
            AccessControlEntry e = b.entry();
            rows.add(String.join(" ", r.resourceType().name(), r.patternType().name(), r.name(),
                                 e.principal(), e.host(), e.operation().name(),
                                 e.permissionType().name()));
        }
        rows.sort(null);
        return rows;
    }

    /**
     * As the admin: ALLOW WRITE and READ on topics prefixed `prefix`, READ on groups prefixed
     * `prefix`, and a DENY DESCRIBE on the literal topic `prefix`-tmp; describe the user's ACLs,
     * delete the DENY, describe again.
     */
    private static void acls(Properties p, String user, String prefix, Map<String, Object> out)
            throws Exception {
        String principal = "User:" + user;
        List<AclBinding> bindings = List.of(
            new AclBinding(new ResourcePattern(ResourceType.TOPIC, prefix, PatternType.PREFIXED),
                new AccessControlEntry(principal, "*", AclOperation.WRITE, AclPermissionType.ALLOW)),
            new AclBinding(new ResourcePattern(ResourceType.TOPIC, prefix, PatternType.PREFIXED),
                new AccessControlEntry(principal, "*", AclOperation.READ, AclPermissionType.ALLOW)),
            new AclBinding(new ResourcePattern(ResourceType.GROUP, prefix, PatternType.PREFIXED),
                new AccessControlEntry(principal, "*", AclOperation.READ, AclPermissionType.ALLOW)),
            new AclBinding(new ResourcePattern(ResourceType.TOPIC, prefix + "-tmp",
                                               PatternType.LITERAL),
                new AccessControlEntry(principal, "*", AclOperation.DESCRIBE,
                                       AclPermissionType.DENY)));
        AclBindingFilter mine = new AclBindingFilter(ResourcePatternFilter.ANY,
            new AccessControlEntryFilter(principal, null, AclOperation.ANY, AclPermissionType.ANY));
        AclBindingFilter deny = new AclBindingFilter(
            new ResourcePatternFilter(ResourceType.TOPIC, prefix + "-tmp", PatternType.LITERAL),
            new AccessControlEntryFilter(principal, null, AclOperation.ANY,
                                         AclPermissionType.DENY));
        try (Admin admin = Admin.create(p)) {
            out.put("createAcls", step(() -> {
                admin.createAcls(bindings).all().get();
                return "ok";
            }));
            out.put("describeAcls", step(() -> text(admin.describeAcls(mine).values().get())));
            out.put("deleteAcls", step(() -> text(admin.deleteAcls(List.of(deny)).all().get())));
            out.put("describeAfterDelete",
                    step(() -> text(admin.describeAcls(mine).values().get())));
        }
    }

    /** Produce `count` records (acks=all, idempotent by default), then read them all in a group
     * (classic protocol, commitSync), and report what the group committed. */
    private static void roundtrip(Properties p, String topic, String group, int count,
                                  Map<String, Object> out) throws Exception {
        List<Object> acked = new ArrayList<>();
        Properties pp = (Properties) p.clone();
        pp.put("acks", "all");
        pp.put("max.block.ms", "20000");
        pp.put("delivery.timeout.ms", "30000");
        try (KafkaProducer<String, String> producer =
                 new KafkaProducer<>(pp, new StringSerializer(), new StringSerializer())) {
            List<java.util.concurrent.Future<RecordMetadata>> sent = new ArrayList<>();
            for (int i = 0; i < count; i++) {
                sent.add(producer.send(new ProducerRecord<>(topic, "k" + i, "v" + i)));
            }
            producer.flush();
            for (java.util.concurrent.Future<RecordMetadata> f : sent) {
                RecordMetadata m = f.get();
                acked.add(List.of(m.partition(), m.offset()));
            }
        }
        out.put("acked", acked);
        Properties cp = (Properties) p.clone();
        cp.put("group.id", group);
        cp.put("group.protocol", "classic");
        cp.put("enable.auto.commit", "false");
        cp.put("auto.offset.reset", "earliest");
        cp.put("fetch.max.wait.ms", "100");
        List<String> values = new ArrayList<>();
        Map<String, Object> committed = new TreeMap<>();
        try (KafkaConsumer<String, String> consumer =
                 new KafkaConsumer<>(cp, new StringDeserializer(), new StringDeserializer())) {
            consumer.subscribe(List.of(topic));
            long deadline = System.nanoTime() + WAIT.toNanos();
            while (values.size() < count && System.nanoTime() < deadline) {
                for (ConsumerRecord<String, String> r : consumer.poll(Duration.ofMillis(200))) {
                    values.add(r.value());
                }
                consumer.commitSync();
            }
            for (Map.Entry<TopicPartition, OffsetAndMetadata> e
                    : consumer.committed(consumer.assignment()).entrySet()) {
                committed.put(e.getKey().toString(),
                              e.getValue() == null ? null : e.getValue().offset());
            }
        }
        values.sort(null);
        out.put("values", values);
        out.put("committed", committed);
    }

    /** A produce to a topic the identity may not write, and a CreateAcls by a non-super user. */
    private static void denied(Properties p, String topic, Map<String, Object> out) {
        Properties pp = (Properties) p.clone();
        pp.put("max.block.ms", "10000");
        pp.put("delivery.timeout.ms", "15000");
        pp.put("request.timeout.ms", "5000");
        out.put("produce", step(() -> {
            try (KafkaProducer<String, String> producer =
                     new KafkaProducer<>(pp, new StringSerializer(), new StringSerializer())) {
                return producer.send(new ProducerRecord<>(topic, "k", "denied")).get().offset();
            }
        }));
        out.put("createAcls", step(() -> {
            try (Admin admin = Admin.create(p)) {
                admin.createAcls(List.of(new AclBinding(
                    new ResourcePattern(ResourceType.TOPIC, topic, PatternType.LITERAL),
                    new AccessControlEntry("User:*", "*", AclOperation.ALL,
                                           AclPermissionType.ALLOW)))).all().get();
                return "ok";
            }
        }));
    }
}
