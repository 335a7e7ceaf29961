import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.function.BooleanSupplier;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.ConsumerGroupDescription;
import org.apache.kafka.clients.admin.MemberDescription;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.TopicPartition;

/** KIP-848 consumer groups (group.protocol=consumer) with members joining and leaving. */
final class GroupScenarios {
    private GroupScenarios() {}

    /** One member on its own thread: poll, report each record, commit, repeat until closed. */
    static final class Member implements Runnable {
        final String name;
        final KafkaConsumer<String, String> consumer;
        volatile List<Integer> assignment = List.of();
        volatile boolean running = true;
        volatile Throwable failure;
        final Thread thread;

        Member(String name, String topic, Map<String, Object> config) {
            this.name = name;
            Map<String, Object> extra = new HashMap<>(config);
            extra.put("client.id", name);
            this.consumer = JavaClient.consumer(extra);
            consumer.subscribe(List.of(topic));
            this.thread = new Thread(this, name);
            thread.start();
        }

        @Override
        public void run() {
            try {
                while (running) {
                    ConsumerRecords<String, String> records = consumer.poll(Duration.ofMillis(100));
                    for (ConsumerRecord<String, String> r : records) {
                        JavaClient.emit("event", "record", "member", name, "record", JavaClient.record(r));
                        CONSUMED.incrementAndGet();
                    }
                    // Committed before the next poll, so a revocation never hands on an uncommitted record.
                    if (!records.isEmpty()) consumer.commitSync();
                    assignment = JavaClient.partitionsOf(consumer.assignment());
                }
                consumer.close();
            } catch (Throwable e) {
                failure = e;
                JavaClient.emit("event", "member-error", "member", name, "type", e.getClass().getName(),
                        "message", String.valueOf(e.getMessage()));
            }
        }

        void close() throws InterruptedException {
            running = false;
            thread.join(30000);
        }
    }

    static final AtomicInteger CONSUMED = new AtomicInteger();

    static void waitFor(String what, BooleanSupplier condition, List<Member> members) throws Exception {
        long deadline = System.currentTimeMillis() + JavaClient.intArg("wait.ms", 30000);
        while (!condition.getAsBoolean()) {
            for (Member m : members) {
                if (m.failure != null) throw new IllegalStateException(m.name + " failed while waiting for " + what, m.failure);
            }
            if (System.currentTimeMillis() > deadline) {
                Map<String, Object> seen = new LinkedHashMap<>();
                for (Member m : members) seen.put(m.name, m.assignment);
                throw new IllegalStateException("timed out waiting for " + what + "; assignments " + Json.of(seen));
            }
            Thread.sleep(50);
        }
        Map<String, Object> seen = new LinkedHashMap<>();
        for (Member m : members) seen.put(m.name, m.assignment);
        JavaClient.emit("event", "reached", "what", what, "assignments", seen);
    }

    static void produce(KafkaProducer<String, String> producer, String topic, int from, int to, int partitions)
            throws Exception {
        List<java.util.concurrent.Future<?>> acks = new ArrayList<>();
        for (int i = from; i < to; i++) acks.add(producer.send(new ProducerRecord<>(topic, i % partitions, "k-" + i, "v-" + i)));
        for (var ack : acks) ack.get();
    }

    static void consumerProtocol() throws Exception {
        String topic = JavaClient.args.get("topic"), group = JavaClient.args.get("group");
        int count = JavaClient.intArg("count", 60), partitions = JavaClient.intArg("partitions", 6);
        Map<String, Object> config = new HashMap<>();
        config.put("group.id", group);
        config.put("group.protocol", "consumer");
        config.put("group.remote.assignor", JavaClient.arg("assignor", "uniform"));
        List<Member> all = new ArrayList<>();
        try (KafkaProducer<String, String> producer = JavaClient.producer(Map.of());
             Admin admin = Admin.create(JavaClient.common())) {
            produce(producer, topic, 0, count / 2, partitions);
            Member a = new Member("member-a", topic, config);
            all.add(a);
            waitFor("a owns every partition", () -> a.assignment.size() == partitions, all);
            Member b = new Member("member-b", topic, config), c = new Member("member-c", topic, config);
            all.add(b);
            all.add(c);
            int share = partitions / 3;
            waitFor("three members share the partitions",
                    () -> a.assignment.size() == share && b.assignment.size() == share && c.assignment.size() == share, all);
            describe(admin, group);
            // Time for the caller to disturb the cluster (kill the group's coordinator) while
            // the three members run.
            Thread.sleep(JavaClient.intArg("hold.ms", 0));
            produce(producer, topic, count / 2, count, partitions);
            a.close();
            JavaClient.emit("event", "left", "member", a.name);
            waitFor("b and c own every partition",
                    () -> b.assignment.size() + c.assignment.size() == partitions && !b.assignment.isEmpty()
                            && !c.assignment.isEmpty(), all);
            waitFor("every record consumed", () -> CONSUMED.get() >= count, all);
            describe(admin, group);
            b.close();
            c.close();
            Map<String, Object> committed = new LinkedHashMap<>();
            for (Map.Entry<TopicPartition, OffsetAndMetadata> e
                    : admin.listConsumerGroupOffsets(group).partitionsToOffsetAndMetadata().get().entrySet()) {
                committed.put(Integer.toString(e.getKey().partition()), e.getValue().offset());
            }
            JavaClient.emit("event", "committed", "offsets", committed);
        } finally {
            for (Member m : all) m.running = false;
        }
    }

    /**
     * KIP-848's online upgrade: a classic member (Kafka's default classic assignors) owns
     * the topic, a consumer-protocol member joins the same group, then the classic member
     * leaves. Every record is read once, with commits, throughout; and a consumer-protocol
     * member that unsubscribes (epoch -1) and subscribes again rejoins.
     */
    static void upgrade() throws Exception {
        String topic = JavaClient.args.get("topic"), group = JavaClient.args.get("group");
        int count = JavaClient.intArg("count", 60), partitions = JavaClient.intArg("partitions", 4);
        Map<String, Object> classic = new HashMap<>(Map.of("group.id", group, "group.protocol", "classic"));
        Map<String, Object> modern = new HashMap<>(Map.of("group.id", group, "group.protocol", "consumer"));
        List<Member> all = new ArrayList<>();
        try (KafkaProducer<String, String> producer = JavaClient.producer(Map.of());
             Admin admin = Admin.create(JavaClient.common())) {
            produce(producer, topic, 0, count / 3, partitions);
            Member old = new Member("classic-member", topic, classic);
            all.add(old);
            waitFor("the classic member owns every partition", () -> old.assignment.size() == partitions, all);
            describe(admin, group);
            Member fresh = new Member("consumer-member", topic, modern);
            all.add(fresh);
            waitFor("both members share the partitions",
                    () -> !old.assignment.isEmpty() && !fresh.assignment.isEmpty()
                            && old.assignment.size() + fresh.assignment.size() == partitions, all);
            describe(admin, group);
            produce(producer, topic, count / 3, 2 * count / 3, partitions);
            old.close();
            waitFor("the consumer member owns every partition", () -> fresh.assignment.size() == partitions, all);
            produce(producer, topic, 2 * count / 3, count, partitions);
            waitFor("every record consumed", () -> CONSUMED.get() >= count, all);
            describe(admin, group);
            fresh.close();
            Map<String, Object> committed = new LinkedHashMap<>();
            for (Map.Entry<TopicPartition, OffsetAndMetadata> e
                    : admin.listConsumerGroupOffsets(group).partitionsToOffsetAndMetadata().get().entrySet()) {
                committed.put(Integer.toString(e.getKey().partition()), e.getValue().offset());
            }
            JavaClient.emit("event", "committed", "offsets", committed);
        } finally {
            for (Member m : all) m.running = false;
        }
        // Unsubscribe (leave with epoch -1) and subscribe again on the same consumer.
        try (KafkaConsumer<String, String> c = JavaClient.consumer(modern)) {
            c.subscribe(List.of(topic));
            long deadline = System.currentTimeMillis() + 20000;
            while (c.assignment().size() != partitions && System.currentTimeMillis() < deadline) c.poll(Duration.ofMillis(50));
            List<Integer> first = JavaClient.partitionsOf(c.assignment());
            c.unsubscribe();
            c.subscribe(List.of(topic));
            while (c.assignment().size() != partitions && System.currentTimeMillis() < deadline) c.poll(Duration.ofMillis(50));
            JavaClient.emit("event", "resubscribed", "first", first, "again", JavaClient.partitionsOf(c.assignment()));
        }
    }

    static void describe(Admin admin, String group) throws Exception {
        ConsumerGroupDescription d = admin.describeConsumerGroups(List.of(group)).describedGroups().get(group).get();
        List<Map<String, Object>> members = new ArrayList<>();
        for (MemberDescription m : d.members()) {
            Map<String, Object> one = new LinkedHashMap<>();
            one.put("memberId", m.consumerId());
            one.put("clientId", m.clientId());
            one.put("memberEpoch", m.memberEpoch().orElse(null));
            one.put("assignment", JavaClient.partitionsOf(m.assignment().topicPartitions()));
            members.add(one);
        }
        JavaClient.emit("event", "described", "type", d.type().name(), "state", d.groupState().name(),
                "assignor", d.partitionAssignor(), "coordinator", d.coordinator().id(), "groupEpoch", d.groupEpoch().orElse(null), "members", members);
    }
}
