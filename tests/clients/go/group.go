package main

import (
	"context"
	"fmt"
	"io/ioutil"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/Shopify/sarama"
)

// group runs a consumer group through two members joining and leaving, in three phases
// of count records each:
//
//  1. member a alone reads phase 1;
//  2. member b joins; once a and b split the partitions, phase 2 is produced and read;
//  3. a leaves (Close); once b holds every partition, phase 3 is produced and read.
//
// Members mark every record they process; Sarama commits marked offsets every 100 ms and
// once more when a member's session ends. At the end the group's committed offsets and
// the partitions' ends are printed.
func group() error {
	producer, err := newProducer()
	if err != nil {
		return err
	}
	defer producer.Close()
	state := &groupState{claims: map[string][]int32{}}
	partitions, err := topicPartitions()
	if err != nil {
		return err
	}

	if err := sendRange(producer, 0, opts.count); err != nil {
		return err
	}
	a, err := state.join("a")
	if err != nil {
		return err
	}
	defer a.stop()
	if err := state.await(fmt.Sprintf("a reads %d records", opts.count), func() bool {
		return state.consumed >= opts.count
	}); err != nil {
		return err
	}

	b, err := state.join("b")
	if err != nil {
		return err
	}
	defer b.stop()
	if err := state.await("a and b split the partitions", func() bool {
		return len(state.claims["a"]) > 0 && len(state.claims["b"]) > 0 &&
			len(state.claims["a"])+len(state.claims["b"]) == len(partitions)
	}); err != nil {
		return err
	}
	if err := sendRange(producer, opts.count, opts.count); err != nil {
		return err
	}
	if err := state.await(fmt.Sprintf("a and b read %d records", 2*opts.count), func() bool {
		return state.consumed >= 2*opts.count
	}); err != nil {
		return err
	}

	if err := a.stop(); err != nil {
		return fmt.Errorf("a leaves: %v", err)
	}
	if err := state.await("b holds every partition", func() bool {
		return len(state.claims["b"]) == len(partitions)
	}); err != nil {
		return err
	}
	if err := sendRange(producer, 2*opts.count, opts.count); err != nil {
		return err
	}
	if err := state.await(fmt.Sprintf("b reads %d records", 3*opts.count), func() bool {
		return state.consumed >= 3*opts.count
	}); err != nil {
		return err
	}
	if err := b.stop(); err != nil {
		return fmt.Errorf("b leaves: %v", err)
	}
	return reportOffsets(partitions)
}

func topicPartitions() ([]int32, error) {
	c, err := config()
	if err != nil {
		return nil, err
	}
	client, err := sarama.NewClient(strings.Split(opts.brokers, ","), c)
	if err != nil {
		return nil, err
	}
	defer client.Close()
	return client.Partitions(opts.topic)
}

// reportOffsets prints what the group committed (OffsetFetch through the ClusterAdmin)
// and where each partition ends.
func reportOffsets(partitions []int32) error {
	c, err := config()
	if err != nil {
		return err
	}
	client, err := sarama.NewClient(strings.Split(opts.brokers, ","), c)
	if err != nil {
		return err
	}
	defer client.Close()
	adm, err := sarama.NewClusterAdmin(strings.Split(opts.brokers, ","), c)
	if err != nil {
		return err
	}
	defer adm.Close()
	committed, err := adm.ListConsumerGroupOffsets(opts.group, map[string][]int32{opts.topic: partitions})
	if err != nil {
		return err
	}
	for _, p := range partitions {
		block := committed.GetBlock(opts.topic, p)
		if block == nil {
			return fmt.Errorf("no committed offset block for partition %d", p)
		}
		if block.Err != sarama.ErrNoError {
			return fmt.Errorf("committed offset of partition %d: %v", p, block.Err)
		}
		end, err := client.GetOffset(opts.topic, p, sarama.OffsetNewest)
		if err != nil {
			return err
		}
		emit(map[string]interface{}{"ev": "offsets", "p": p, "committed": block.Offset, "end": end})
	}
	groups, err := adm.ListConsumerGroups()
	if err != nil {
		return err
	}
	described, err := adm.DescribeConsumerGroups([]string{opts.group})
	if err != nil {
		return err
	}
	d := described[0]
	emit(map[string]interface{}{"ev": "group", "listed_type": groups[opts.group], "state": d.State,
		"protocol_type": d.ProtocolType, "members": len(d.Members), "error": int16(d.Err)})
	return nil
}

// groupState is what the members report to the scenario: records consumed so far and
// each member's current claims (empty between sessions).
type groupState struct {
	mu       sync.Mutex
	consumed int
	claims   map[string][]int32
}

func (s *groupState) await(what string, done func() bool) error {
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		s.mu.Lock()
		ok := done()
		s.mu.Unlock()
		if ok {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return fmt.Errorf("waited 30s for %s: consumed %d, claims %v", what, s.consumed, s.claims)
}

type member struct {
	name    string
	group   sarama.ConsumerGroup
	cancel  context.CancelFunc
	done    chan struct{}
	stopped bool
	err     error
}

// join starts a member that consumes the topic until stopped.
func (s *groupState) join(name string) (*member, error) {
	c, err := config()
	if err != nil {
		return nil, err
	}
	c.Consumer.Offsets.Initial = sarama.OffsetOldest
	c.Consumer.Offsets.CommitInterval = 100 * time.Millisecond
	// Sarama 1.22 sends OffsetCommit v1 unless a retention is set, and v2 with one. Kafka
	// 4.0 removed v0-v1 (KIP-896) and so does the gateway: it closes the connection.
	c.Consumer.Offsets.Retention = 24 * time.Hour
	c.Consumer.Group.Heartbeat.Interval = 300 * time.Millisecond
	c.Consumer.Group.Session.Timeout = time.Duration(opts.sessionMs) * time.Millisecond
	c.Consumer.Group.Rebalance.Timeout = 10 * time.Second
	c.Consumer.Return.Errors = true
	switch opts.strategy {
	case "range":
		c.Consumer.Group.Rebalance.Strategy = sarama.BalanceStrategyRange
	case "roundrobin":
		c.Consumer.Group.Rebalance.Strategy = sarama.BalanceStrategyRoundRobin
	default:
		return nil, fmt.Errorf("unknown strategy %q", opts.strategy)
	}
	g, err := sarama.NewConsumerGroup(strings.Split(opts.brokers, ","), opts.group, c)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	m := &member{name: name, group: g, cancel: cancel, done: make(chan struct{})}
	go func() {
		for e := range g.Errors() {
			emit(map[string]interface{}{"ev": "group-error", "member": name, "error": e.Error()})
		}
	}()
	go func() {
		defer close(m.done)
		// Consume returns at the end of every session (a rebalance), or with an error when
		// the coordinator cannot be reached: either way, rejoin until stopped.
		for ctx.Err() == nil {
			err := g.Consume(ctx, []string{opts.topic}, &handler{name: name, state: s})
			if err == sarama.ErrClosedConsumerGroup {
				m.err = err
				return
			}
			if err != nil {
				emit(map[string]interface{}{"ev": "group-error", "member": name, "error": err.Error()})
				time.Sleep(200 * time.Millisecond)
			}
		}
	}()
	return m, nil
}

func (m *member) stop() error {
	if m.stopped {
		return nil
	}
	m.stopped = true
	m.cancel()
	<-m.done
	if err := m.group.Close(); err != nil {
		return err
	}
	return m.err
}

type handler struct {
	name  string
	state *groupState
}

func (h *handler) Setup(session sarama.ConsumerGroupSession) error {
	claimed := append([]int32(nil), session.Claims()[opts.topic]...)
	sort.Slice(claimed, func(i, j int) bool { return claimed[i] < claimed[j] })
	h.state.mu.Lock()
	h.state.claims[h.name] = claimed
	h.state.mu.Unlock()
	emit(map[string]interface{}{"ev": "assigned", "member": h.name, "generation": session.GenerationID(),
		"partitions": claimed})
	return nil
}

func (h *handler) Cleanup(sarama.ConsumerGroupSession) error {
	h.state.mu.Lock()
	h.state.claims[h.name] = nil
	h.state.mu.Unlock()
	return nil
}

func (h *handler) ConsumeClaim(session sarama.ConsumerGroupSession, claim sarama.ConsumerGroupClaim) error {
	for {
		select {
		case m, ok := <-claim.Messages():
			if !ok {
				return nil
			}
			emit(recordEvent(h.name, m))
			session.MarkMessage(m, "")
			h.state.mu.Lock()
			h.state.consumed++
			h.state.mu.Unlock()
		case <-session.Context().Done():
			return nil
		}
	}
}

// oneMember joins the group as one member (named by -member) and consumes until its stdin
// closes, then leaves. The test kills one with SIGKILL to see the group drop it after its
// session timeout (-session-ms) without a LeaveGroup.
func oneMember() error {
	state := &groupState{claims: map[string][]int32{}}
	m, err := state.join(opts.member)
	if err != nil {
		return err
	}
	_, _ = ioutil.ReadAll(os.Stdin)
	return m.stop()
}

// committed prints the group's committed offsets and the partitions' ends (no member joins).
func committed() error {
	partitions, err := topicPartitions()
	if err != nil {
		return err
	}
	return reportOffsets(partitions)
}
