import java.time.Duration;
import java.util.ArrayList;
import java.util.Collection;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.Set;
import java.util.TreeMap;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AlterConfigOp;
import org.apache.kafka.clients.admin.Config;
import org.apache.kafka.clients.admin.ConfigEntry;
import org.apache.kafka.clients.admin.DescribeClusterResult;
import org.apache.kafka.clients.admin.GroupListing;
import org.apache.kafka.clients.admin.ListGroupsOptions;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.admin.OffsetSpec;
import org.apache.kafka.clients.admin.RecordsToDelete;
import org.apache.kafka.clients.admin.TopicDescription;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.GroupType;
import org.apache.kafka.common.Node;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.TopicPartitionInfo;
import org.apache.kafka.common.config.ConfigResource;

/**
 * The AdminClient calls a user makes, each reported as its own "step" line (ok, or the
 * exception's class), so one failing call does not hide the others.
 */
final class AdminScenarios {
    private AdminScenarios() {}

    interface Step {
        Object run() throws Exception;
    }

    static Object step(String name, Step body) {
        try {
            Object result = body.run();
            JavaClient.emit("event", "step", "step", name, "ok", true, "result", result);
            return result;
        } catch (Throwable e) {
            Throwable cause = e.getCause() != null && e instanceof java.util.concurrent.ExecutionException ? e.getCause() : e;
            JavaClient.emit("event", "step", "step", name, "ok", false, "type", cause.getClass().getName(),
                    "message", String.valueOf(cause.getMessage()));
            return null;
        }
    }

    static void run() throws Exception {
        String prefix = JavaClient.args.get("prefix");
        String plain = prefix + "-plain", assigned = prefix + "-assigned";
        try (Admin admin = Admin.create(JavaClient.common())) {
            step("describeCluster", () -> {
                DescribeClusterResult c = admin.describeCluster();
                List<Integer> ids = new ArrayList<>();
                for (Node n : c.nodes().get()) ids.add(n.id());
                Map<String, Object> out = new LinkedHashMap<>();
                out.put("clusterId", c.clusterId().get());
                out.put("controller", c.controller().get().id());
                out.put("nodes", ids);
                return out;
            });
            int broker = admin.describeCluster().nodes().get().iterator().next().id();
            step("createTopics", () -> {
                NewTopic byCount = new NewTopic(plain, 3, (short) 1).configs(Map.of("retention.ms", "3600000"));
                NewTopic byAssignment = new NewTopic(assigned, Map.of(0, List.of(broker), 1, List.of(broker)));
                admin.createTopics(List.of(byCount, byAssignment)).all().get();
                return List.of(plain, assigned);
            });
            step("createTopics existing", () -> admin.createTopics(List.of(new NewTopic(plain, 1, (short) 1))).all().get());
            step("listTopics", () -> new ArrayList<>(admin.listTopics().names().get()));
            step("describeTopics", () -> {
                Map<String, Object> out = new TreeMap<>();
                for (TopicDescription d : admin.describeTopics(List.of(plain, assigned)).allTopicNames().get().values()) {
                    List<Map<String, Object>> parts = new ArrayList<>();
                    for (TopicPartitionInfo p : d.partitions()) {
                        parts.add(Map.of("partition", p.partition(), "leader", p.leader().id(),
                                "replicas", p.replicas().size(), "isr", p.isr().size()));
                    }
                    out.put(d.name(), Map.of("topicId", d.topicId().toString(), "partitions", parts));
                }
                return out;
            });
            ConfigResource topicResource = new ConfigResource(ConfigResource.Type.TOPIC, plain);
            step("describeConfigs topic", () -> configs(admin, topicResource));
            step("describeConfigs broker", () -> {
                Map<String, Object> all = configs(admin, new ConfigResource(ConfigResource.Type.BROKER, Integer.toString(broker)));
                return Map.of("count", all.size(), "num.partitions", String.valueOf(all.get("num.partitions")));
            });
            step("incrementalAlterConfigs", () -> {
                admin.incrementalAlterConfigs(Map.of(topicResource, List.of(
                        new AlterConfigOp(new ConfigEntry("retention.ms", "7200000"), AlterConfigOp.OpType.SET),
                        new AlterConfigOp(new ConfigEntry("cleanup.policy", "compact"), AlterConfigOp.OpType.APPEND)))).all().get();
                Map<String, Object> after = configs(admin, topicResource);
                return Map.of("retention.ms", after.get("retention.ms"), "cleanup.policy", after.get("cleanup.policy"));
            });
            step("incrementalAlterConfigs delete", () -> {
                admin.incrementalAlterConfigs(Map.of(topicResource, List.of(
                        new AlterConfigOp(new ConfigEntry("retention.ms", ""), AlterConfigOp.OpType.DELETE),
                        new AlterConfigOp(new ConfigEntry("cleanup.policy", "compact"), AlterConfigOp.OpType.SUBTRACT)))).all().get();
                Map<String, Object> after = configs(admin, topicResource);
                return Map.of("retention.ms", after.get("retention.ms"), "cleanup.policy", after.get("cleanup.policy"));
            });
            step("createPartitions", () -> {
                admin.createPartitions(Map.of(assigned, org.apache.kafka.clients.admin.NewPartitions.increaseTo(3))).all().get();
                return admin.describeTopics(List.of(assigned)).allTopicNames().get().get(assigned).partitions().size();
            });
            TopicPartition p0 = new TopicPartition(plain, 0);
            try (KafkaProducer<String, String> producer = JavaClient.producer(Map.of())) {
                for (int i = 0; i < 10; i++) producer.send(new ProducerRecord<>(plain, 0, "k" + i, "v" + i)).get();
            }
            step("listOffsets", () -> offsets(admin, p0));
            step("deleteRecords", () -> admin.deleteRecords(Map.of(p0, RecordsToDelete.beforeOffset(4)))
                    .lowWatermarks().get(p0).get().lowWatermark());
            step("listOffsets after deleteRecords", () -> offsets(admin, p0));
            // One classic and one consumer-protocol group, alive while the groups are listed.
            try (KafkaConsumer<String, String> classic = member(prefix + "-classic", "classic", plain);
                 KafkaConsumer<String, String> modern = member(prefix + "-modern", "consumer", plain)) {
                step("listGroups", () -> groups(admin.listGroups().all().get(), prefix));
                step("listGroups consumer type", () -> groups(
                        admin.listGroups(new ListGroupsOptions().withTypes(Set.of(GroupType.CONSUMER))).all().get(), prefix));
                step("listConsumerGroups", () -> {
                    @SuppressWarnings("removal")
                    Collection<?> listed = admin.listConsumerGroups().all().get();
                    List<String> ids = new ArrayList<>();
                    for (Object o : listed) {
                        String id = ((org.apache.kafka.clients.admin.ConsumerGroupListing) o).groupId();
                        if (id.startsWith(prefix)) ids.add(id);
                    }
                    ids.sort(null);
                    return ids;
                });
                step("describeConsumerGroups", () -> {
                    Map<String, Object> out = new TreeMap<>();
                    for (var e : admin.describeConsumerGroups(List.of(prefix + "-classic", prefix + "-modern")).all().get().entrySet()) {
                        out.put(e.getKey(), Map.of("type", e.getValue().type().name(),
                                "members", e.getValue().members().size(), "state", e.getValue().groupState().name()));
                    }
                    return out;
                });
            }
            step("listConsumerGroupOffsets", () -> {
                Map<String, Object> out = new TreeMap<>();
                for (var e : admin.listConsumerGroupOffsets(prefix + "-classic").partitionsToOffsetAndMetadata().get().entrySet()) {
                    out.put(e.getKey().toString(), e.getValue().offset());
                }
                return out;
            });
            step("deleteConsumerGroups", () -> {
                admin.deleteConsumerGroups(List.of(prefix + "-classic")).all().get();
                return groups(admin.listGroups().all().get(), prefix);
            });
            step("deleteTopics", () -> {
                admin.deleteTopics(List.of(assigned)).all().get();
                // Metadata may show a deleted topic for a moment (in Kafka too): wait for it to go.
                long deadline = System.currentTimeMillis() + 10000;
                while (admin.listTopics().names().get().contains(assigned) && System.currentTimeMillis() < deadline) {
                    Thread.sleep(50);
                }
                return admin.listTopics().names().get().contains(assigned);
            });
        }
    }

    static Map<String, Object> configs(Admin admin, ConfigResource resource) throws Exception {
        Config config = admin.describeConfigs(List.of(resource)).all().get().get(resource);
        Map<String, Object> out = new TreeMap<>();
        for (ConfigEntry e : config.entries()) out.put(e.name(), e.value());
        return out;
    }

    static Map<String, Object> offsets(Admin admin, TopicPartition tp) throws Exception {
        Map<String, Object> out = new LinkedHashMap<>();
        out.put("earliest", admin.listOffsets(Map.of(tp, OffsetSpec.earliest())).partitionResult(tp).get().offset());
        out.put("latest", admin.listOffsets(Map.of(tp, OffsetSpec.latest())).partitionResult(tp).get().offset());
        out.put("maxTimestamp", admin.listOffsets(Map.of(tp, OffsetSpec.maxTimestamp())).partitionResult(tp).get().offset());
        return out;
    }

    /** A group member that has joined (one poll) and committed its position. */
    static KafkaConsumer<String, String> member(String group, String protocol, String topic) {
        Map<String, Object> extra = new HashMap<>();
        extra.put("group.id", group);
        extra.put("group.protocol", protocol);
        KafkaConsumer<String, String> consumer = JavaClient.consumer(extra);
        consumer.subscribe(List.of(topic));
        long deadline = System.currentTimeMillis() + 20000;
        while (consumer.assignment().isEmpty() && System.currentTimeMillis() < deadline) consumer.poll(Duration.ofMillis(100));
        consumer.commitSync();
        return consumer;
    }

    static Map<String, Object> groups(Collection<GroupListing> listed, String prefix) {
        Map<String, Object> out = new TreeMap<>();
        for (GroupListing g : listed) {
            if (!g.groupId().startsWith(prefix)) continue;
            Optional<GroupType> type = g.type();
            out.put(g.groupId(), Map.of("type", type.map(GroupType::name).orElse("none"), "protocol", g.protocol(),
                    "state", g.groupState().map(Enum::name).orElse("none")));
        }
        return out;
    }
}
