import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.OffsetSpec;
import org.apache.kafka.clients.admin.TransactionDescription;
import org.apache.kafka.clients.admin.TransactionListing;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.consumer.OffsetAndTimestamp;
import org.apache.kafka.clients.consumer.SubscriptionPattern;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.acl.AclBindingFilter;
import org.apache.kafka.common.quota.ClientQuotaFilter;

/**
 * Client behaviours beyond the basic paths, each reported as a step (see AdminScenarios):
 * compression, fencing, static members and regex subscriptions under KIP-848, the classic
 * cooperative assignor, and the AdminClient's less common calls.
 */
final class MoreScenarios {
    private MoreScenarios() {}

    static Object step(String name, AdminScenarios.Step body) {
        return AdminScenarios.step(name, body);
    }

    /** Operation names in order, or null when the answer had none (not requested). */
    static List<String> sorted(java.util.Set<org.apache.kafka.common.acl.AclOperation> ops) {
        if (ops == null) return null;
        List<String> names = new ArrayList<>();
        for (var op : ops) names.add(op.name());
        names.sort(null);
        return names;
    }

    /** Every record of `topic` from the beginning (assigned, no group), as values. */
    static List<String> readAll(String topic, int partitions, String isolation) {
        List<TopicPartition> tps = new ArrayList<>();
        for (int p = 0; p < partitions; p++) tps.add(new TopicPartition(topic, p));
        List<String> values = new ArrayList<>();
        try (KafkaConsumer<String, String> c = JavaClient.consumer(Map.of("isolation.level", isolation))) {
            c.assign(tps);
            c.seekToBeginning(tps);
            Map<TopicPartition, Long> ends = c.endOffsets(tps);
            long deadline = System.currentTimeMillis() + 20000;
            while (System.currentTimeMillis() < deadline && !TxnScenarios.reachedEnd(c, ends)) {
                for (ConsumerRecord<String, String> r : c.poll(Duration.ofMillis(100))) values.add(r.value());
            }
        }
        return values;
    }

    static void run() throws Exception {
        String prefix = JavaClient.args.get("prefix");
        String topic = prefix + "-t";
        try (Admin admin = Admin.create(JavaClient.common())) {
            admin.createTopics(List.of(new org.apache.kafka.clients.admin.NewTopic(topic, 2, (short) 1))).all().get();
            for (String codec : new String[] {"gzip", "lz4"}) {
                step("compression " + codec, () -> {
                    try (KafkaProducer<String, String> p = JavaClient.producer(Map.of("compression.type", codec, "linger.ms", "20"))) {
                        for (int i = 0; i < 50; i++) p.send(new ProducerRecord<>(topic, 0, "k", codec + "-" + i + "-" + "x".repeat(100)));
                        p.flush();
                    }
                    return readAll(topic, 2, "read_uncommitted").stream().filter(v -> v.startsWith(codec)).count();
                });
            }
            for (String acks : new String[] {"0", "1"}) {
                step("acks " + acks, () -> {
                    try (KafkaProducer<String, String> p = JavaClient.producer(Map.of("acks", acks, "enable.idempotence", "false"))) {
                        for (int i = 0; i < 20; i++) p.send(new ProducerRecord<>(topic, 1, "k", "acks" + acks + "-" + i)).get();
                    }
                    // acks 0 and 1 answer before the records are committed: read until they are.
                    long deadline = System.currentTimeMillis() + 10000, seen;
                    do {
                        seen = readAll(topic, 2, "read_uncommitted").stream().filter(v -> v.startsWith("acks" + acks + "-")).count();
                    } while (seen < 20 && System.currentTimeMillis() < deadline);
                    return seen;
                });
            }
            step("offsetsForTimes", () -> {
                try (KafkaConsumer<String, String> c = JavaClient.consumer(Map.of())) {
                    TopicPartition tp = new TopicPartition(topic, 0);
                    Map<TopicPartition, OffsetAndTimestamp> found = c.offsetsForTimes(Map.of(tp, 0L));
                    Map<TopicPartition, OffsetAndTimestamp> future = c.offsetsForTimes(Map.of(tp, Long.MAX_VALUE / 2));
                    return Map.of("zero", found.get(tp).offset(), "future", String.valueOf(future.get(tp)));
                }
            });
            step("producer fenced", () -> {
                String txid = prefix + "-fence";
                KafkaProducer<String, String> old = JavaClient.producer(Map.of("transactional.id", txid));
                old.initTransactions();
                old.beginTransaction();
                old.send(new ProducerRecord<>(topic, 1, "k", "zombie")).get();
                try (KafkaProducer<String, String> fresh = JavaClient.producer(Map.of("transactional.id", txid))) {
                    fresh.initTransactions();  // aborts the zombie's open transaction
                    fresh.beginTransaction();
                    fresh.send(new ProducerRecord<>(topic, 1, "k", "fresh")).get();
                    fresh.commitTransaction();
                }
                String outcome;
                try {
                    old.commitTransaction();
                    outcome = "committed";
                } catch (Exception e) {
                    outcome = e.getClass().getSimpleName();
                } finally {
                    old.close(Duration.ofSeconds(5));
                }
                List<String> committed = readAll(topic, 2, "read_committed");
                return Map.of("zombie", outcome, "zombieVisible", committed.contains("zombie"),
                        "freshVisible", committed.contains("fresh"));
            });
            step("static member rejoins with its partitions", () -> staticMembers(topic));
            step("regex subscription", () -> regex(admin, prefix));
            step("classic cooperative-sticky", () -> cooperative(topic));
            step("alterConsumerGroupOffsets", () -> {
                String group = prefix + "-altered";
                TopicPartition tp = new TopicPartition(topic, 0);
                admin.alterConsumerGroupOffsets(group, Map.of(tp, new OffsetAndMetadata(7, "note"))).all().get();
                OffsetAndMetadata got = admin.listConsumerGroupOffsets(group).partitionsToOffsetAndMetadata().get().get(tp);
                admin.deleteConsumerGroupOffsets(group, java.util.Set.of(tp)).all().get();
                Object after = admin.listConsumerGroupOffsets(group).partitionsToOffsetAndMetadata().get().get(tp);
                return Map.of("offset", got.offset(), "metadata", got.metadata(), "afterDelete", String.valueOf(after));
            });
            step("listTransactions", () -> {
                List<String> ids = new ArrayList<>();
                for (TransactionListing t : admin.listTransactions().all().get()) {
                    if (t.transactionalId().startsWith(prefix)) ids.add(t.transactionalId() + ":" + t.state());
                }
                return ids;
            });
            step("describeTransactions", () -> {
                TransactionDescription d = admin.describeTransactions(List.of(prefix + "-fence")).all().get().get(prefix + "-fence");
                return Map.of("state", d.state().toString(), "epoch", d.producerEpoch());
            });
            step("describeFeatures", () -> admin.describeFeatures().featureMetadata().get().finalizedFeatures().keySet().toString());
            step("describeAcls", () -> admin.describeAcls(AclBindingFilter.ANY).values().get().size());
            step("describeClientQuotas", () -> admin.describeClientQuotas(ClientQuotaFilter.all()).entities().get().size());
            step("describeUserScramCredentials", () -> admin.describeUserScramCredentials().all().get().size());
            step("listPartitionReassignments", () -> admin.listPartitionReassignments().reassignments().get().size());
            step("electLeaders", () -> admin.electLeaders(org.apache.kafka.common.ElectionType.PREFERRED,
                    java.util.Set.of(new TopicPartition(topic, 0))).partitions().get().toString());
            step("describeLogDirs", () -> {
                int node = admin.describeCluster().nodes().get().iterator().next().id();
                Map<String, Object> out = new TreeMap<>();
                for (var dir : admin.describeLogDirs(List.of(node)).allDescriptions().get().get(node).entrySet()) {
                    for (var replica : dir.getValue().replicaInfos().entrySet()) {
                        if (replica.getKey().topic().equals(topic)) out.put(replica.getKey().toString(), replica.getValue().size());
                    }
                    out.put("dirs", dir.getKey().isEmpty() ? 0 : 1);
                    out.put("usable", dir.getValue().usableBytes().orElse(-1L) > 0);
                }
                return out;
            });
            step("static member id conflict", () -> staticConflict(topic));
            step("fenceProducers", () -> {
                admin.fenceProducers(List.of(prefix + "-fence")).all().get();
                return admin.describeTransactions(List.of(prefix + "-fence")).all().get().get(prefix + "-fence").producerEpoch();
            });
            step("removeMembersFromConsumerGroup", () -> removeMembers(admin, topic));
            step("createTopics validateOnly", () -> {
                admin.createTopics(List.of(new org.apache.kafka.clients.admin.NewTopic(prefix + "-dry", 1, (short) 1)),
                        new org.apache.kafka.clients.admin.CreateTopicsOptions().validateOnly(true)).all().get();
                return admin.listTopics().names().get().contains(prefix + "-dry");
            });
            step("createTopics bad config", () -> {
                try {
                    admin.createTopics(List.of(new org.apache.kafka.clients.admin.NewTopic(prefix + "-bad", 1, (short) 1)
                            .configs(Map.of("retention.ms", "soon")))).all().get();
                    return "created";
                } catch (java.util.concurrent.ExecutionException e) {
                    return e.getCause().getClass().getSimpleName();
                }
            });
            step("record too large", () -> {
                try (KafkaProducer<String, String> p = JavaClient.producer(Map.of("max.request.size", "4000000"))) {
                    p.send(new ProducerRecord<>(topic, 0, "k", "x".repeat(2_000_000))).get();
                    return "accepted";
                } catch (java.util.concurrent.ExecutionException e) {
                    return e.getCause().getClass().getSimpleName();
                }
            });
            step("offset reset none after deleteRecords", () -> {
                TopicPartition tp = new TopicPartition(topic, 0);
                admin.deleteRecords(Map.of(tp, org.apache.kafka.clients.admin.RecordsToDelete.beforeOffset(5))).all().get();
                try (KafkaConsumer<String, String> c = JavaClient.consumer(Map.of("auto.offset.reset", "none"))) {
                    c.assign(List.of(tp));
                    c.seek(tp, 1);
                    try {
                        c.poll(Duration.ofSeconds(5));
                        return "no error at " + c.position(tp);
                    } catch (org.apache.kafka.clients.consumer.OffsetOutOfRangeException e) {
                        return "OffsetOutOfRangeException " + e.offsetOutOfRangePartitions().get(tp);
                    }
                }
            });
            for (Object[] spec : new Object[][] {{"earliestLocal", OffsetSpec.earliestLocal()}, {"latestTiered", OffsetSpec.latestTiered()},
                    {"earliestPendingUpload", OffsetSpec.earliestPendingUpload()}}) {
                step("listOffsets " + spec[0], () -> admin.listOffsets(Map.of(new TopicPartition(topic, 0), (OffsetSpec) spec[1]))
                        .all().get().get(new TopicPartition(topic, 0)).offset());
            }
            step("open transaction bounds read_committed", () -> {
                TopicPartition tp = new TopicPartition(topic, 1);
                try (KafkaProducer<String, String> p = JavaClient.producer(Map.of("transactional.id", prefix + "-open"));
                     KafkaConsumer<String, String> committed = JavaClient.consumer(Map.of("isolation.level", "read_committed"));
                     KafkaConsumer<String, String> uncommitted = JavaClient.consumer(Map.of("isolation.level", "read_uncommitted"))) {
                    long before = committed.endOffsets(List.of(tp)).get(tp);
                    p.initTransactions();
                    p.beginTransaction();
                    p.send(new ProducerRecord<>(topic, 1, "k", "open")).get();
                    Map<String, Object> out = new LinkedHashMap<>();
                    out.put("committedEndMoved", committed.endOffsets(List.of(tp)).get(tp) - before);
                    out.put("uncommittedEndMoved", uncommitted.endOffsets(List.of(tp)).get(tp) - before);
                    p.commitTransaction();
                    out.put("afterCommitMoved", committed.endOffsets(List.of(tp)).get(tp) - before);
                    return out;
                }
            });
            step("alterConsumerGroupOffsets on a live group", () -> {
                String group = prefix + "-live";
                try (KafkaConsumer<String, String> c = AdminScenarios.member(group, "consumer", topic)) {
                    try {
                        admin.alterConsumerGroupOffsets(group, Map.of(new TopicPartition(topic, 0), new OffsetAndMetadata(1))).all().get();
                        return "altered";
                    } catch (java.util.concurrent.ExecutionException e) {
                        return e.getCause().getClass().getSimpleName();
                    }
                }
            });
            step("authorized operations", () -> {
                Map<String, Object> out = new LinkedHashMap<>();
                out.put("topic", sorted(admin.describeTopics(List.of(topic),
                        new org.apache.kafka.clients.admin.DescribeTopicsOptions().includeAuthorizedOperations(true))
                        .allTopicNames().get().get(topic).authorizedOperations()));
                out.put("cluster", sorted(admin.describeCluster(
                        new org.apache.kafka.clients.admin.DescribeClusterOptions().includeAuthorizedOperations(true))
                        .authorizedOperations().get()));
                out.put("group", sorted(admin.describeConsumerGroups(List.of(prefix + "-static"),
                        new org.apache.kafka.clients.admin.DescribeConsumerGroupsOptions().includeAuthorizedOperations(true))
                        .all().get().get(prefix + "-static").authorizedOperations()));
                return out;
            });
            step("clientInstanceId", () -> {
                try (KafkaProducer<String, String> p = JavaClient.producer(Map.of())) {
                    return String.valueOf(p.clientInstanceId(Duration.ofSeconds(10)));
                }
            });
            step("topics by id", () -> {
                String doomed = prefix + "-byid";
                admin.createTopics(List.of(new org.apache.kafka.clients.admin.NewTopic(doomed, 1, (short) 1))).all().get();
                org.apache.kafka.common.Uuid id = admin.describeTopics(List.of(doomed)).allTopicNames().get().get(doomed).topicId();
                String named = admin.describeTopics(org.apache.kafka.common.TopicCollection.ofTopicIds(List.of(id)))
                        .allTopicIds().get().get(id).name();
                admin.deleteTopics(org.apache.kafka.common.TopicCollection.ofTopicIds(List.of(id))).all().get();
                // Metadata may show a deleted topic for a moment (in Kafka too): wait for it to go.
                long deadline = System.currentTimeMillis() + 10000;
                while (admin.listTopics().names().get().contains(doomed) && System.currentTimeMillis() < deadline) Thread.sleep(50);
                return Map.of("named", named, "left", admin.listTopics().names().get().contains(doomed));
            });
            step("unknown remote assignor", () -> {
                Map<String, Object> conf = new HashMap<>(Map.of("group.id", prefix + "-noassignor", "group.protocol", "consumer",
                        "group.remote.assignor", "no-such-assignor"));
                try (KafkaConsumer<String, String> c = JavaClient.consumer(conf)) {
                    c.subscribe(List.of(topic));
                    long deadline = System.currentTimeMillis() + 10000;
                    while (System.currentTimeMillis() < deadline) c.poll(Duration.ofMillis(100));
                    return "joined";
                } catch (org.apache.kafka.common.KafkaException e) {
                    return e.getClass().getSimpleName();
                }
            });
            step("transaction timeout too long", () -> {
                try (KafkaProducer<String, String> p = JavaClient.producer(Map.of("transactional.id", prefix + "-long",
                        "transaction.timeout.ms", "3600000", "delivery.timeout.ms", "3600000"))) {
                    p.initTransactions();
                    return "initialized";
                } catch (org.apache.kafka.common.KafkaException e) {
                    // Kafka's producer reports INVALID_TRANSACTION_TIMEOUT as an unexpected error.
                    Throwable cause = e.getCause() != null ? e.getCause() : e;
                    return cause.getClass().getSimpleName() + ": " + cause.getMessage();
                }
            });
            step("listOffsets forTimestamp", () -> admin.listOffsets(Map.of(new TopicPartition(topic, 0), OffsetSpec.forTimestamp(0)))
                    .all().get().get(new TopicPartition(topic, 0)).offset());
        }
    }

    /** KIP-848 static membership: a member that closes (epoch -2) and comes back within the
     * session timeout keeps its partitions; the other member's never move. */
    static Object staticMembers(String topic) throws Exception {
        String group = JavaClient.args.get("prefix") + "-static";
        Map<String, Object> base = new HashMap<>();
        base.put("group.id", group);
        base.put("group.protocol", "consumer");
        Map<String, Object> one = new HashMap<>(base), two = new HashMap<>(base);
        one.put("group.instance.id", "static-1");
        two.put("group.instance.id", "static-2");
        Map<String, Object> out = new LinkedHashMap<>();
        try (KafkaConsumer<String, String> b = JavaClient.consumer(two)) {
            b.subscribe(List.of(topic));
            List<Integer> first;
            try (KafkaConsumer<String, String> a = JavaClient.consumer(one)) {
                a.subscribe(List.of(topic));
                long deadline = System.currentTimeMillis() + 20000;
                while ((a.assignment().size() != 1 || b.assignment().size() != 1) && System.currentTimeMillis() < deadline) {
                    a.poll(Duration.ofMillis(50));
                    b.poll(Duration.ofMillis(50));
                }
                first = JavaClient.partitionsOf(a.assignment());
                out.put("before", first);
            }
            try (KafkaConsumer<String, String> again = JavaClient.consumer(one)) {
                again.subscribe(List.of(topic));
                long deadline = System.currentTimeMillis() + 20000;
                while (again.assignment().isEmpty() && System.currentTimeMillis() < deadline) {
                    again.poll(Duration.ofMillis(50));
                    b.poll(Duration.ofMillis(50));
                }
                out.put("after", JavaClient.partitionsOf(again.assignment()));
                out.put("other", JavaClient.partitionsOf(b.assignment()));
            }
        }
        return out;
    }

    /** KIP-848: a second live member with the same group.instance.id is refused
     * (UNRELEASED_INSTANCE_ID) while the first holds it. */
    static Object staticConflict(String topic) {
        Map<String, Object> conf = new HashMap<>();
        conf.put("group.id", JavaClient.args.get("prefix") + "-conflict");
        conf.put("group.protocol", "consumer");
        conf.put("group.instance.id", "same");
        try (KafkaConsumer<String, String> a = JavaClient.consumer(conf); KafkaConsumer<String, String> b = JavaClient.consumer(conf)) {
            a.subscribe(List.of(topic));
            long deadline = System.currentTimeMillis() + 20000;
            while (a.assignment().isEmpty() && System.currentTimeMillis() < deadline) a.poll(Duration.ofMillis(50));
            b.subscribe(List.of(topic));
            try {
                while (System.currentTimeMillis() < deadline) {
                    b.poll(Duration.ofMillis(100));
                    a.poll(Duration.ofMillis(10));
                }
                return "both joined";
            } catch (Exception e) {
                return Map.of("second", e.getClass().getSimpleName(), "firstKeeps", JavaClient.partitionsOf(a.assignment()));
            }
        }
    }

    /** A classic static member removed by the AdminClient (LeaveGroup by instance id). */
    static Object removeMembers(Admin admin, String topic) throws Exception {
        String group = JavaClient.args.get("prefix") + "-remove";
        Map<String, Object> conf = new HashMap<>();
        conf.put("group.id", group);
        conf.put("group.instance.id", "removable");
        try (KafkaConsumer<String, String> a = JavaClient.consumer(conf)) {
            a.subscribe(List.of(topic));
            long deadline = System.currentTimeMillis() + 20000;
            while (a.assignment().isEmpty() && System.currentTimeMillis() < deadline) a.poll(Duration.ofMillis(50));
            admin.removeMembersFromConsumerGroup(group, new org.apache.kafka.clients.admin.RemoveMembersFromConsumerGroupOptions(
                    List.of(new org.apache.kafka.clients.admin.MemberToRemove("removable")))).all().get();
            return admin.describeConsumerGroups(List.of(group)).all().get().get(group).members().size();
        }
    }

    /** KIP-848 server-side regex (SubscriptionPattern, RE2J syntax): the gateway resolves it
     * and a topic created later joins the assignment. (A java.util.regex.Pattern is matched
     * by the client against its metadata instead, refreshed every metadata.max.age.ms.) */
    static Object regex(Admin admin, String prefix) throws Exception {
        String stem = prefix + "-rx";
        admin.createTopics(List.of(new org.apache.kafka.clients.admin.NewTopic(stem + "-a", 1, (short) 1))).all().get();
        Map<String, Object> extra = new HashMap<>();
        extra.put("group.id", prefix + "-regex");
        extra.put("group.protocol", "consumer");
        try (KafkaConsumer<String, String> c = JavaClient.consumer(extra)) {
            c.subscribe(new SubscriptionPattern(stem.replace("-", "\\-") + "\\-.*"));
            long deadline = System.currentTimeMillis() + 20000;
            while (c.assignment().isEmpty() && System.currentTimeMillis() < deadline) c.poll(Duration.ofMillis(100));
            List<String> first = new ArrayList<>();
            for (TopicPartition tp : c.assignment()) first.add(tp.toString());
            admin.createTopics(List.of(new org.apache.kafka.clients.admin.NewTopic(stem + "-b", 1, (short) 1))).all().get();
            deadline = System.currentTimeMillis() + 20000;
            while (c.assignment().size() < 2 && System.currentTimeMillis() < deadline) c.poll(Duration.ofMillis(100));
            List<String> second = new ArrayList<>();
            for (TopicPartition tp : c.assignment()) second.add(tp.toString());
            first.sort(null);
            second.sort(null);
            return Map.of("first", first, "second", second);
        }
    }

    /** The classic protocol with Kafka's cooperative-sticky assignor: two members split the topic. */
    static Object cooperative(String topic) throws Exception {
        Map<String, Object> extra = new HashMap<>();
        extra.put("group.id", JavaClient.args.get("prefix") + "-coop");
        extra.put("partition.assignment.strategy", "org.apache.kafka.clients.consumer.CooperativeStickyAssignor");
        try (KafkaConsumer<String, String> a = JavaClient.consumer(extra); KafkaConsumer<String, String> b = JavaClient.consumer(extra)) {
            a.subscribe(List.of(topic));
            long deadline = System.currentTimeMillis() + 20000;
            while (a.assignment().size() != 2 && System.currentTimeMillis() < deadline) a.poll(Duration.ofMillis(50));
            b.subscribe(List.of(topic));
            while ((a.assignment().size() != 1 || b.assignment().size() != 1) && System.currentTimeMillis() < deadline) {
                a.poll(Duration.ofMillis(50));
                b.poll(Duration.ofMillis(50));
            }
            Map<String, Object> out = new TreeMap<>();
            out.put("a", JavaClient.partitionsOf(a.assignment()));
            out.put("b", JavaClient.partitionsOf(b.assignment()));
            out.put("generation", a.groupMetadata().generationId());
            return out;
        }
    }
}
