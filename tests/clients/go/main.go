// Command gokafka drives Sarama (Debian's 1.22.1) against a Stratalog gateway for
// tests/test_go_client.py. It runs the scenarios named on the command line in order, with
// the flags shared between them, and prints one JSON object per line: what it produced,
// consumed, was assigned or was told. The Python test asserts on those lines; a failure
// prints {"ev":"error",...} and exits 1.
//
// Scenarios: produce (SyncProducer), async (AsyncProducer, pipelined), consume (PartitionConsumer from -offset), group (two
// members joining and leaving, group.go), member (one member until stdin closes),
// committed (the group's offsets), offset-at (by timestamp), admin (ClusterAdmin, admin.go),
// delete-records.
//
//	gokafka -brokers 127.0.0.1:9092 -topic t -codec zstd -count 40 produce
package main

import (
	"crypto/sha512"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"flag"
	"fmt"
	"io/ioutil"
	"log"
	"os"
	"strings"
	"time"

	"github.com/Shopify/sarama"
	"github.com/xdg-go/scram"
)

type options struct {
	brokers       string
	topic         string
	codec         string
	count         int
	start         int
	idempotent    bool
	partition     int
	offset        int64
	group         string
	strategy      string
	tlsCA         string
	mechanism     string
	user          string
	password      string
	member        string
	sessionMs     int
	fetchBytes    int
	maxMessage    int
	committedOnly bool
	at            int64
	valueBytes    int
	verbose       bool
}

var opts options

func main() {
	flag.StringVar(&opts.brokers, "brokers", "127.0.0.1:9092", "bootstrap address")
	flag.StringVar(&opts.topic, "topic", "", "topic of the scenario")
	flag.StringVar(&opts.codec, "codec", "none", "none, gzip, snappy, lz4 or zstd")
	flag.IntVar(&opts.count, "count", 20, "records to produce or consume (per phase in group)")
	flag.IntVar(&opts.start, "start", 0, "index of the first produced record")
	flag.BoolVar(&opts.idempotent, "idempotent", false, "Producer.Idempotent")
	flag.IntVar(&opts.partition, "partition", 0, "partition of consume")
	flag.Int64Var(&opts.offset, "offset", 0, "first offset of consume")
	flag.StringVar(&opts.group, "group", "", "consumer group id")
	flag.StringVar(&opts.strategy, "strategy", "range", "range or roundrobin")
	flag.StringVar(&opts.tlsCA, "tls-ca", "", "CA file: connect over TLS")
	flag.StringVar(&opts.mechanism, "sasl", "", "SCRAM-SHA-512 or PLAIN")
	flag.StringVar(&opts.user, "user", "", "SASL user")
	flag.StringVar(&opts.password, "password", "", "SASL password")
	flag.StringVar(&opts.member, "member", "m", "name of the member scenario's member")
	flag.IntVar(&opts.sessionMs, "session-ms", 6000, "Consumer.Group.Session.Timeout")
	flag.IntVar(&opts.fetchBytes, "fetch-bytes", 0, "Consumer.Fetch.Default (0: Sarama's)")
	flag.Int64Var(&opts.at, "at", -1, "timestamp of offset-at")
	flag.BoolVar(&opts.committedOnly, "read-committed", false, "Consumer.IsolationLevel = ReadCommitted")
	flag.IntVar(&opts.maxMessage, "max-message-bytes", 0, "Producer.MaxMessageBytes (0: Sarama's)")
	flag.IntVar(&opts.valueBytes, "value-bytes", 0, "pad each value to at least this size")
	flag.BoolVar(&opts.verbose, "v", false, "Sarama's log on stderr")
	flag.Parse()
	if opts.verbose {
		sarama.Logger = log.New(os.Stderr, "[sarama] ", log.Lmicroseconds)
	}
	scenarios := map[string]func() error{
		"produce": produce, "consume": consume, "group": group, "admin": admin,
		"delete-records": deleteRecords, "member": oneMember, "async": async,
		"committed": committed, "offset-at": offsetAt,
	}
	for _, name := range flag.Args() {
		run, ok := scenarios[name]
		if !ok {
			fail(fmt.Errorf("unknown scenario %q", name))
		}
		if err := run(); err != nil {
			fail(fmt.Errorf("%s: %v", name, err))
		}
	}
}

func emit(fields map[string]interface{}) {
	line, err := json.Marshal(fields)
	if err != nil {
		line, _ = json.Marshal(map[string]interface{}{"ev": "unprintable", "error": err.Error()})
	}
	fmt.Println(string(line))
}

func fail(err error) {
	emit(map[string]interface{}{"ev": "error", "error": err.Error()})
	os.Exit(1)
}

// config is what every scenario shares: Kafka 2.1 (the first version zstd needs), short
// timeouts so a broken gateway fails the test fast, and TLS and SASL when asked for.
func config() (*sarama.Config, error) {
	c := sarama.NewConfig()
	c.Version = sarama.V2_1_0_0
	c.ClientID = "stratalog-go-test"
	c.Net.DialTimeout = 5 * time.Second
	c.Net.ReadTimeout = 15 * time.Second
	c.Net.WriteTimeout = 5 * time.Second
	c.Metadata.Retry.Backoff = 100 * time.Millisecond
	if opts.tlsCA != "" {
		pem, err := ioutil.ReadFile(opts.tlsCA)
		if err != nil {
			return nil, err
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("no certificate in %s", opts.tlsCA)
		}
		c.Net.TLS.Enable = true
		c.Net.TLS.Config = &tls.Config{RootCAs: pool, ServerName: "localhost"}
	}
	if opts.mechanism != "" {
		c.Net.SASL.Enable = true
		c.Net.SASL.Handshake = true
		c.Net.SASL.User = opts.user
		c.Net.SASL.Password = opts.password
		c.Net.SASL.Mechanism = sarama.SASLMechanism(opts.mechanism)
		if opts.mechanism == sarama.SASLTypeSCRAMSHA512 {
			c.Net.SASL.SCRAMClientGeneratorFunc = func() sarama.SCRAMClient {
				return &scramClient{hash: scram.HashGeneratorFcn(sha512.New)}
			}
		}
	}
	return c, nil
}

// scramClient adapts xdg-go/scram's client conversation to Sarama's SCRAMClient.
type scramClient struct {
	hash scram.HashGeneratorFcn
	conv *scram.ClientConversation
}

func (s *scramClient) Begin(user, password, authzID string) error {
	client, err := s.hash.NewClient(user, password, authzID)
	if err != nil {
		return err
	}
	s.conv = client.NewConversation()
	return nil
}

func (s *scramClient) Step(challenge string) (string, error) { return s.conv.Step(challenge) }
func (s *scramClient) Done() bool                            { return s.conv.Done() }

var codecs = map[string]sarama.CompressionCodec{
	"none": sarama.CompressionNone, "gzip": sarama.CompressionGZIP,
	"snappy": sarama.CompressionSnappy, "lz4": sarama.CompressionLZ4, "zstd": sarama.CompressionZSTD,
}

// message is record number i of a run: keyed (so the hash partitioner spreads records over
// the partitions), a compressible value, and headers including an empty one.
func message(i int) *sarama.ProducerMessage {
	value := fmt.Sprintf("value-%d-%s-%s", i, opts.codec, strings.Repeat("stratalog ", 1+i%4))
	if pad := opts.valueBytes - len(value); pad > 0 {
		value += strings.Repeat("#", pad)
	}
	return &sarama.ProducerMessage{
		Topic: opts.topic,
		Key:   sarama.StringEncoder(fmt.Sprintf("key-%d", i)),
		Value: sarama.StringEncoder(value),
		Headers: []sarama.RecordHeader{
			{Key: []byte("index"), Value: []byte(fmt.Sprint(i))},
			{Key: []byte("codec"), Value: []byte(opts.codec)},
			{Key: []byte("empty"), Value: []byte{}},
		},
	}
}

func newProducer() (sarama.SyncProducer, error) {
	c, err := config()
	if err != nil {
		return nil, err
	}
	codec, ok := codecs[opts.codec]
	if !ok {
		return nil, fmt.Errorf("unknown codec %q", opts.codec)
	}
	c.Producer.RequiredAcks = sarama.WaitForAll
	c.Producer.Return.Successes = true
	c.Producer.Compression = codec
	c.Producer.Retry.Backoff = 100 * time.Millisecond
	// Hold records until a whole SendMessages call is buffered, so that each partition's
	// share of it travels as one batch (what the codec checks read back).
	c.Producer.Flush.Messages = opts.count
	c.Producer.Flush.Frequency = time.Second
	if opts.maxMessage > 0 {
		c.Producer.MaxMessageBytes = opts.maxMessage
	}
	if opts.idempotent {
		c.Producer.Idempotent = true
		c.Net.MaxOpenRequests = 1
	}
	return sarama.NewSyncProducer(strings.Split(opts.brokers, ","), c)
}

// produce sends records start..start+count-1 in one SendMessages call, so that each
// partition's records travel as one compressed batch.
func produce() error {
	p, err := newProducer()
	if err != nil {
		return err
	}
	defer p.Close()
	return sendRange(p, opts.start, opts.count)
}

func sendRange(p sarama.SyncProducer, start, count int) error {
	msgs := make([]*sarama.ProducerMessage, count)
	for i := range msgs {
		msgs[i] = message(start + i)
	}
	if err := p.SendMessages(msgs); err != nil {
		if errs, ok := err.(sarama.ProducerErrors); ok && len(errs) > 0 {
			return fmt.Errorf("%d of %d failed, first: %v", len(errs), count, errs[0].Err)
		}
		return err
	}
	for i, m := range msgs {
		emit(map[string]interface{}{"ev": "produced", "index": start + i, "p": m.Partition, "o": m.Offset})
	}
	return nil
}

func recordEvent(member string, m *sarama.ConsumerMessage) map[string]interface{} {
	headers := make([][]string, 0, len(m.Headers))
	for _, h := range m.Headers {
		headers = append(headers, []string{string(h.Key), string(h.Value)})
	}
	return map[string]interface{}{"ev": "record", "member": member, "p": m.Partition, "o": m.Offset,
		"key": string(m.Key), "value": string(m.Value), "headers": headers,
		"ts": m.Timestamp.UnixNano() / int64(time.Millisecond)}
}

// consume reads count records of one partition from an offset with a PartitionConsumer,
// then reports the partition's high watermark.
func consume() error {
	c, err := config()
	if err != nil {
		return err
	}
	if opts.fetchBytes > 0 {
		c.Consumer.Fetch.Default = int32(opts.fetchBytes)
	}
	if opts.committedOnly {
		c.Consumer.IsolationLevel = sarama.ReadCommitted
	}
	consumer, err := sarama.NewConsumer(strings.Split(opts.brokers, ","), c)
	if err != nil {
		return err
	}
	defer consumer.Close()
	pc, err := consumer.ConsumePartition(opts.topic, int32(opts.partition), opts.offset)
	if err != nil {
		// Reported, not failed: an offset out of range is an answer the test asks for.
		emit(map[string]interface{}{"ev": "consume-refused", "error": err.Error()})
		return nil
	}
	defer pc.Close()
	deadline := time.After(20 * time.Second)
	for got := 0; got < opts.count; got++ {
		select {
		case m := <-pc.Messages():
			emit(recordEvent("", m))
		case e := <-pc.Errors():
			return e
		case <-deadline:
			return fmt.Errorf("only %d of %d records in 20s", got, opts.count)
		}
	}
	emit(map[string]interface{}{"ev": "hwm", "p": opts.partition, "o": pc.HighWaterMarkOffset()})
	return nil
}

// deleteRecords moves the partition's log start to -offset with ClusterAdmin.DeleteRecords.
func deleteRecords() error {
	adm, err := clusterAdmin()
	if err != nil {
		return err
	}
	defer adm.Close()
	if err := adm.DeleteRecords(opts.topic, map[int32]int64{int32(opts.partition): opts.offset}); err != nil {
		return err
	}
	emit(map[string]interface{}{"ev": "records-deleted", "p": opts.partition, "before": opts.offset})
	return nil
}

// async sends -count records through an AsyncProducer that flushes each as soon as it
// can, with up to 5 requests in flight on the connection (Sarama's default): the gateway
// must answer pipelined Produce requests in order for the offsets to follow the sends.
func async() error {
	c, err := config()
	if err != nil {
		return err
	}
	c.Producer.RequiredAcks = sarama.WaitForAll
	c.Producer.Return.Successes = true
	c.Producer.Compression = codecs[opts.codec]
	c.Producer.Retry.Max = 0 // a retry could reorder records; none is expected
	p, err := sarama.NewAsyncProducer(strings.Split(opts.brokers, ","), c)
	if err != nil {
		return err
	}
	go func() {
		for i := 0; i < opts.count; i++ {
			m := message(opts.start + i)
			m.Metadata = opts.start + i
			p.Input() <- m
		}
	}()
	deadline := time.After(30 * time.Second)
	for done := 0; done < opts.count; done++ {
		select {
		case m := <-p.Successes():
			emit(map[string]interface{}{"ev": "produced", "index": m.Metadata, "p": m.Partition, "o": m.Offset})
		case e := <-p.Errors():
			return e.Err
		case <-deadline:
			return fmt.Errorf("only %d of %d acknowledged in 30s", done, opts.count)
		}
	}
	return p.Close()
}

// offsetAt prints Client.GetOffset for the partition at -at (ms since the epoch; -1 and -2
// are Sarama's newest and oldest): ListOffsets by timestamp.
func offsetAt() error {
	c, err := config()
	if err != nil {
		return err
	}
	client, err := sarama.NewClient(strings.Split(opts.brokers, ","), c)
	if err != nil {
		return err
	}
	defer client.Close()
	offset, err := client.GetOffset(opts.topic, int32(opts.partition), opts.at)
	if err != nil {
		return err
	}
	emit(map[string]interface{}{"ev": "offset-at", "at": opts.at, "o": offset})
	return nil
}

// clusterAdmin opens a ClusterAdmin on the brokers with the scenario's settings.
func clusterAdmin() (sarama.ClusterAdmin, error) {
	c, err := config()
	if err != nil {
		return nil, err
	}
	return sarama.NewClusterAdmin(strings.Split(opts.brokers, ","), c)
}
