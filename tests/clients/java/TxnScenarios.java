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
