package main

import (
	"fmt"

	"github.com/Shopify/sarama"
)

// admin walks the ClusterAdmin through a topic's life: create it with configs (twice: the
// second must fail), list it, describe its configs and the cluster, delete it, list again.
func admin() error {
	adm, err := clusterAdmin()
	if err != nil {
		return err
	}
	defer adm.Close()
	retention, cleanup := "3600000", "delete"
	detail := &sarama.TopicDetail{NumPartitions: 3, ReplicationFactor: 1,
		ConfigEntries: map[string]*string{"retention.ms": &retention, "cleanup.policy": &cleanup}}
	if err := adm.CreateTopic(opts.topic, detail, false); err != nil {
		return err
	}
	emit(map[string]interface{}{"ev": "created", "topic": opts.topic})
	emit(map[string]interface{}{"ev": "created-again", "error": errText(adm.CreateTopic(opts.topic, detail, false))})

	if err := listTopics(adm); err != nil {
		return err
	}
	entries, err := adm.DescribeConfig(sarama.ConfigResource{Type: sarama.TopicResource, Name: opts.topic})
	if err != nil {
		return err
	}
	configs := map[string]interface{}{}
	for _, e := range entries {
		configs[e.Name] = map[string]interface{}{"value": e.Value, "default": e.Default, "read_only": e.ReadOnly,
			"sensitive": e.Sensitive}
	}
	emit(map[string]interface{}{"ev": "configs", "configs": configs})
	only, err := adm.DescribeConfig(sarama.ConfigResource{Type: sarama.TopicResource, Name: opts.topic,
		ConfigNames: []string{"retention.ms"}})
	if err != nil {
		return err
	}
	names := []string{}
	for _, e := range only {
		names = append(names, e.Name)
	}
	emit(map[string]interface{}{"ev": "configs-named", "names": names})

	// AlterConfig replaces the topic's dynamic configs as a whole (Kafka's AlterConfigs).
	day := "86400000"
	if err := adm.AlterConfig(sarama.TopicResource, opts.topic, map[string]*string{"retention.ms": &day}, false); err != nil {
		return err
	}
	altered, err := adm.DescribeConfig(sarama.ConfigResource{Type: sarama.TopicResource, Name: opts.topic,
		ConfigNames: []string{"retention.ms", "cleanup.policy"}})
	if err != nil {
		return err
	}
	after := map[string]interface{}{}
	for _, e := range altered {
		after[e.Name] = map[string]interface{}{"value": e.Value, "default": e.Default}
	}
	emit(map[string]interface{}{"ev": "altered", "configs": after})
	if err := adm.CreatePartitions(opts.topic, 5, nil, false); err != nil {
		return err
	}
	described, err := adm.DescribeTopics([]string{opts.topic})
	if err != nil {
		return err
	}
	emit(map[string]interface{}{"ev": "described", "partitions": len(described[0].Partitions),
		"error": int16(described[0].Err)})

	brokers, controller, err := adm.DescribeCluster()
	if err != nil {
		return err
	}
	// Sarama 1.22 numbers its BrokerResource 5, which Kafka's DescribeConfigs has not (its
	// BROKER is 4, Sarama's ClusterResource): the gateway refuses 5, and 4 is the broker.
	brokerName := fmt.Sprint(brokers[0].ID())
	_, wrongType := adm.DescribeConfig(sarama.ConfigResource{Type: sarama.BrokerResource, Name: brokerName})
	emit(map[string]interface{}{"ev": "broker-resource-5", "error": errText(wrongType)})
	broker, err := adm.DescribeConfig(sarama.ConfigResource{Type: sarama.ClusterResource,
		Name: brokerName, ConfigNames: []string{"num.partitions", "log.retention.ms"}})
	if err != nil {
		return err
	}
	brokerConfigs := map[string]interface{}{}
	for _, e := range broker {
		brokerConfigs[e.Name] = e.Value
	}
	emit(map[string]interface{}{"ev": "broker-configs", "configs": brokerConfigs})
	addrs := []string{}
	for _, b := range brokers {
		addrs = append(addrs, b.Addr())
	}
	emit(map[string]interface{}{"ev": "cluster", "brokers": addrs, "controller": controller})

	if err := adm.DeleteTopic(opts.topic); err != nil {
		return err
	}
	emit(map[string]interface{}{"ev": "deleted", "topic": opts.topic})
	emit(map[string]interface{}{"ev": "deleted-again", "error": errText(adm.DeleteTopic(opts.topic))})
	return listTopics(adm)
}

func listTopics(adm sarama.ClusterAdmin) error {
	topics, err := adm.ListTopics()
	if err != nil {
		return err
	}
	listed := map[string]interface{}{}
	for name, d := range topics {
		listed[name] = map[string]interface{}{"partitions": d.NumPartitions, "replication": d.ReplicationFactor}
	}
	emit(map[string]interface{}{"ev": "topics", "topics": listed})
	return nil
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
