import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;

import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.TopicPartition;

/** Transactional producers: commit and abort, and KIP-447's read-process-write loop. */
final class TxnScenarios {
    private TxnScenarios() {}

    static void send(KafkaProducer<String, String> producer, String topic, String prefix, int n) {
        for (int i = 0; i < n; i++) producer.send(new ProducerRecord<>(topic, i % 2, prefix + "-" + i, prefix + "-" + i));
    }

    /** Commit 3 records, abort 3, commit 3 more; then read the topic read_committed and read_uncommitted. */
    static void commitAndAbort() throws Exception {
        String topic = JavaClient.args.get("topic");
        try (KafkaProducer<String, String> producer = JavaClient.producer(
                Map.of("transactional.id", JavaClient.args.get("transactional.id")))) {
            producer.initTransactions();
            for (String[] step : new String[][] {{"committed1", "commit"}, {"aborted", "abort"}, {"committed2", "commit"}}) {
                producer.beginTransaction();
                send(producer, topic, step[0], 3);
                producer.flush();
                if (step[1].equals("commit")) producer.commitTransaction();
                else producer.abortTransaction();
                JavaClient.emit("event", "transaction", "prefix", step[0], "outcome", step[1]);
            }
        }
        for (String isolation : new String[] {"read_committed", "read_uncommitted"}) {
            List<String> values = new ArrayList<>();
            try (KafkaConsumer<String, String> consumer = JavaClient.consumer(Map.of("isolation.level", isolation))) {
                List<TopicPartition> tps = List.of(new TopicPartition(topic, 0), new TopicPartition(topic, 1));
                consumer.assign(tps);
                consumer.seekToBeginning(tps);
                Map<TopicPartition, Long> ends = consumer.endOffsets(tps);
                long deadline = System.currentTimeMillis() + 20000;
                while (System.currentTimeMillis() < deadline && !reachedEnd(consumer, ends)) {
                    for (ConsumerRecord<String, String> r : consumer.poll(Duration.ofMillis(200))) values.add(r.value());
                }
                JavaClient.emit("event", "read", "isolation", isolation, "values", values, "end", ends.values());
            }
        }
    }

    static boolean reachedEnd(KafkaConsumer<String, String> consumer, Map<TopicPartition, Long> ends) {
        for (Map.Entry<TopicPartition, Long> e : ends.entrySet()) {
            if (consumer.position(e.getKey()) < e.getValue()) return false;
        }
        return true;
    }

    /**
     * KIP-447 fencing: offsets sent to a transaction with group metadata that is no longer
     * current (a member that has left, or an older generation/member epoch) must fail the
     * commit; with the current metadata they are committed.
     */
    static void zombie() throws Exception {
        String input = JavaClient.args.get("input"), group = JavaClient.args.get("group");
        Map<String, Object> extra = new HashMap<>();
        extra.put("group.id", group);
        extra.put("group.protocol", JavaClient.arg("group.protocol", "classic"));
        TopicPartition tp = new TopicPartition(input, 0);
        org.apache.kafka.clients.consumer.ConsumerGroupMetadata first, current;
        try (KafkaConsumer<String, String> a = JavaClient.consumer(extra)) {
            a.subscribe(List.of(input));
            long deadline = System.currentTimeMillis() + 20000;
            while (a.assignment().size() != 2 && System.currentTimeMillis() < deadline) a.poll(Duration.ofMillis(50));
            first = a.groupMetadata();
            try (KafkaConsumer<String, String> b = JavaClient.consumer(extra)) {
                b.subscribe(List.of(input));
                while ((a.assignment().size() != 1 || b.assignment().size() != 1) && System.currentTimeMillis() < deadline) {
                    a.poll(Duration.ofMillis(50));
                    b.poll(Duration.ofMillis(50));
                }
                current = a.groupMetadata();
                JavaClient.emit("event", "generations", "first", first.generationId(), "current", current.generationId());
                TopicPartition owned = a.assignment().iterator().next();
                JavaClient.emit("event", "commit", "with", "older generation", "outcome", commitWith(first, owned, 3));
                JavaClient.emit("event", "commit", "with", "current", "outcome", commitWith(current, owned, 4));
                // One more member: the first metadata is now two generations (member epochs) old.
                try (KafkaConsumer<String, String> c = JavaClient.consumer(extra)) {
                    c.subscribe(List.of(input));
                    while (a.groupMetadata().generationId() == current.generationId() && System.currentTimeMillis() < deadline) {
                        a.poll(Duration.ofMillis(50));
                        b.poll(Duration.ofMillis(50));
                        c.poll(Duration.ofMillis(50));
                    }
                    TopicPartition still = a.assignment().isEmpty() ? owned : a.assignment().iterator().next();
                    JavaClient.emit("event", "commit", "with", "two generations back", "generation", a.groupMetadata().generationId(),
                            "outcome", commitWith(first, still, 6));
                }
            }
        }
        // Both members have left: the last metadata names a member the group no longer has.
        JavaClient.emit("event", "commit", "with", "departed member", "outcome", commitWith(current, tp, 5));
    }

    static String commitWith(org.apache.kafka.clients.consumer.ConsumerGroupMetadata metadata, TopicPartition tp, long offset) {
        try (KafkaProducer<String, String> producer = JavaClient.producer(
                Map.of("transactional.id", JavaClient.args.get("transactional.id")))) {
            producer.initTransactions();
            producer.beginTransaction();
            try {
                producer.sendOffsetsToTransaction(Map.of(tp, new OffsetAndMetadata(offset)), metadata);
                producer.commitTransaction();
                return "committed";
            } catch (org.apache.kafka.common.KafkaException e) {
                try {
                    producer.abortTransaction();
                } catch (org.apache.kafka.common.KafkaException ignored) {
                    // a fatal error leaves nothing to abort
                }
                return e.getClass().getSimpleName();
            }
        }
    }

    /**
     * Read `count` records of `input` in group `group` (read_committed), write each value
     * upper-cased to `output` and commit the input offsets inside the same transaction with
     * the consumer's group metadata (member id and generation fence a zombie, KIP-447).
     */
    static void readProcessWrite() throws Exception {
        String input = JavaClient.args.get("input"), output = JavaClient.args.get("output");
        int count = JavaClient.intArg("count", 10);
        Map<String, Object> extra = new HashMap<>();
        extra.put("group.id", JavaClient.args.get("group"));
        extra.put("group.protocol", JavaClient.arg("group.protocol", "classic"));
        extra.put("isolation.level", "read_committed");
        int done = 0, transactions = 0;
        long deadline = System.currentTimeMillis() + 40000;
        try (KafkaConsumer<String, String> consumer = JavaClient.consumer(extra);
             KafkaProducer<String, String> producer = JavaClient.producer(
                     Map.of("transactional.id", JavaClient.args.get("transactional.id")))) {
            producer.initTransactions();
            consumer.subscribe(List.of(input));
            while (done < count && System.currentTimeMillis() < deadline) {
                ConsumerRecords<String, String> records = consumer.poll(Duration.ofMillis(200));
                if (records.isEmpty()) continue;
                producer.beginTransaction();
                Map<TopicPartition, OffsetAndMetadata> next = new HashMap<>();
                for (ConsumerRecord<String, String> r : records) {
                    producer.send(new ProducerRecord<>(output, r.partition(), r.key(), r.value().toUpperCase()));
                    next.put(new TopicPartition(r.topic(), r.partition()), new OffsetAndMetadata(r.offset() + 1));
                    done++;
                }
                producer.sendOffsetsToTransaction(next, consumer.groupMetadata());
                producer.commitTransaction();
                transactions++;
            }
            JavaClient.emit("event", "processed", "count", done, "transactions", transactions,
                    "generation", consumer.groupMetadata().generationId(), "memberId", consumer.groupMetadata().memberId());
        }
    }
}
