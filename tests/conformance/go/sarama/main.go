// Command sarama drives IBM/Shopify sarama, as Debian 12 packages it
// (golang-github-shopify-sarama-dev 1.22), against a broker:
//
//	sarama <bootstrap> roundtrip <codec> <topic> <records file>
//	sarama <bootstrap> consume <topic> <count>
//	sarama <bootstrap> idempotent <topic> <partitions> <per partition>
//	sarama <bootstrap> resume <topic> <group> <partitions> <per partition> <first part> [<retention ms>]
//	sarama <bootstrap> share <topic> <group> <partitions> <per partition>
//
// It prints one JSON line on stdout saying what the client saw; it judges nothing (the pytest
// side does). sarama's own log goes to stderr. Exit code 0 when the scenario ran to its end
// (errors the client reported are in the summary), 2 when it could not.
//
// The client is configured for Kafka 2.1 (Config.Version), the newest request versions this
// sarama knows that a Kafka 4 broker still serves: Produce v3, Fetch v4, Metadata v5,
// ListOffsets v1, CreateTopics v2, JoinGroup v1, OffsetFetch v1. OffsetCommit is v2 only when
// Consumer.Offsets.Retention is set (v1 otherwise, which Kafka 4 no longer serves).
package main

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"log"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/Shopify/sarama"
)

// clientVersion is the Debian package's version, set at build time by install.sh.
var clientVersion = "unknown"

const deadline = 90 * time.Second

func main() {
	if len(os.Args) < 3 {
		fail("usage: sarama <bootstrap> <scenario> <args...>")
	}
	sarama.Logger = log.New(os.Stderr, "[sarama] ", log.Ltime|log.Lmicroseconds)
	time.AfterFunc(deadline, func() { fail(fmt.Sprintf("no result after %s", deadline)) })
	bootstrap, scenario, args := os.Args[1], os.Args[2], os.Args[3:]
	run := map[string]func(string, []string) map[string]interface{}{
		"roundtrip":  roundtrip,
		"consume":    consumeOnly,
		"idempotent": idempotent,
		"resume":     resume,
		"share":      share,
	}[scenario]
	if run == nil {
		fail("unknown scenario " + scenario)
	}
	summary := run(bootstrap, args)
	summary["client"] = clientVersion
	summary["scenario"] = scenario
	out, err := json.Marshal(summary)
	check(err, "encode the summary")
	fmt.Println(string(out))
}

func fail(why string) {
	fmt.Fprintln(os.Stderr, "sarama:", why)
	os.Exit(2)
}

func check(err error, what string) {
	if err != nil {
		fail(what + ": " + err.Error())
	}
}

func atoi(s string) int {
	n, err := strconv.Atoi(s)
	check(err, "argument "+s)
	return n
}

// -- configuration ---------------------------------------------------------------------------

func newConfig() *sarama.Config {
	c := sarama.NewConfig()
	c.ClientID = "mini-broker-conformance"
	c.Version = sarama.V2_1_0_0
	c.Net.DialTimeout = 5 * time.Second
	c.Net.ReadTimeout = 15 * time.Second
	c.Net.WriteTimeout = 15 * time.Second
	c.Metadata.Retry.Backoff = 100 * time.Millisecond
	c.Admin.Timeout = 10 * time.Second
	c.Producer.RequiredAcks = sarama.WaitForAll
	c.Producer.Return.Successes = true
	c.Producer.Partitioner = sarama.NewManualPartitioner
	c.Producer.Retry.Backoff = 100 * time.Millisecond
	c.Consumer.Return.Errors = true
	c.Consumer.MaxWaitTime = 100 * time.Millisecond
	c.Consumer.Offsets.Initial = sarama.OffsetOldest
	// A retention makes sarama send OffsetCommit v2; without one it sends v1.
	c.Consumer.Offsets.Retention = 24 * time.Hour
	c.Consumer.Offsets.CommitInterval = 200 * time.Millisecond
	c.Consumer.Group.Session.Timeout = 6 * time.Second
	c.Consumer.Group.Heartbeat.Interval = 300 * time.Millisecond
	c.Consumer.Group.Rebalance.Timeout = 10 * time.Second
	c.Consumer.Group.Rebalance.Retry.Backoff = 300 * time.Millisecond
	return c
}

var codecs = map[string]sarama.CompressionCodec{
	"none":   sarama.CompressionNone,
	"gzip":   sarama.CompressionGZIP,
	"snappy": sarama.CompressionSnappy,
	"lz4":    sarama.CompressionLZ4,
	"zstd":   sarama.CompressionZSTD,
}

func createTopic(bootstrap, topic string, partitions int) {
	admin, err := sarama.NewClusterAdmin([]string{bootstrap}, newConfig())
	check(err, "cluster admin")
	defer admin.Close()
	detail := &sarama.TopicDetail{NumPartitions: int32(partitions), ReplicationFactor: 1}
	check(admin.CreateTopic(topic, detail, false), "create topic "+topic)
}

// -- bytes as text: "-" is null, "=" + base64 is bytes (empty included) ------------------------

func token(b []byte) string {
	if b == nil {
		return "-"
	}
	return "=" + base64.StdEncoding.EncodeToString(b)
}

func untoken(s string) []byte {
	if s == "-" {
		return nil
	}
	b, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(s, "="))
	check(err, "record file token")
	if b == nil {
		b = []byte{}
	}
	return b
}

func encoder(b []byte) sarama.Encoder {
	if b == nil {
		return nil
	}
	return sarama.ByteEncoder(b)
}

// readRecords parses the records file: per line a CreateTime in ms, key, value, then header
// key/value pairs, tab-separated tokens.
func readRecords(path, topic string) []*sarama.ProducerMessage {
	f, err := os.Open(path)
	check(err, "records file")
	defer f.Close()
	var msgs []*sarama.ProducerMessage
	scanner := bufio.NewScanner(f)
	scanner.Buffer(make([]byte, 1<<20), 16<<20)
	for scanner.Scan() {
		fields := strings.Split(scanner.Text(), "\t")
		ms, err := strconv.ParseInt(fields[0], 10, 64)
		check(err, "timestamp")
		msg := &sarama.ProducerMessage{
			Topic:     topic,
			Partition: 0,
			Key:       encoder(untoken(fields[1])),
			Value:     encoder(untoken(fields[2])),
			Timestamp: time.Unix(0, ms*int64(time.Millisecond)),
		}
		for i := 3; i+1 < len(fields); i += 2 {
			msg.Headers = append(msg.Headers,
				sarama.RecordHeader{Key: untoken(fields[i]), Value: untoken(fields[i+1])})
		}
		msgs = append(msgs, msg)
	}
	check(scanner.Err(), "records file")
	return msgs
}

func millis(t time.Time) int64 {
	if t.IsZero() {
		return -1
	}
	return t.UnixNano() / int64(time.Millisecond)
}

// record is what the consumer saw: offset, timestamp, key, value, headers.
func record(m *sarama.ConsumerMessage) []interface{} {
	headers := [][]string{}
	for _, h := range m.Headers {
		headers = append(headers, []string{token(h.Key), token(h.Value)})
	}
	return []interface{}{m.Offset, millis(m.Timestamp), token(m.Key), token(m.Value), headers}
}

func errorTexts(err error) []string {
	if errs, ok := err.(sarama.ProducerErrors); ok {
		out := []string{}
		for _, e := range errs {
			out = append(out, e.Err.Error())
		}
		return out
	}
	return []string{err.Error()}
}

// consumePartition reads `count` records of partition 0 from the beginning, or until the first
// error or 20 s.
func consumePartition(bootstrap, topic string, count int) ([][]interface{}, []string) {
	consumer, err := sarama.NewConsumer([]string{bootstrap}, newConfig())
	check(err, "consumer")
	defer consumer.Close()
	pc, err := consumer.ConsumePartition(topic, 0, sarama.OffsetOldest)
	check(err, "consume partition")
	defer pc.Close()
	records, errs := [][]interface{}{}, []string{}
	timeout := time.After(20 * time.Second)
	for len(records) < count {
		select {
		case m := <-pc.Messages():
			records = append(records, record(m))
		case e := <-pc.Errors():
			return records, append(errs, e.Error())
		case <-timeout:
			return records, append(errs, fmt.Sprintf("%d of %d records in 20 s", len(records), count))
		}
	}
	return records, errs
}

// -- scenarios -------------------------------------------------------------------------------

// roundtrip: one producer with the codec sends every record of the file in one request to
// partition 0 of a new topic; a partition consumer reads them back from the beginning.
func roundtrip(bootstrap string, args []string) map[string]interface{} {
	codec, topic, path := args[0], args[1], args[2]
	createTopic(bootstrap, topic, 1)
	msgs := readRecords(path, topic)
	conf := newConfig()
	conf.Producer.Compression = codecs[codec]
	conf.Producer.Flush.Messages = len(msgs)
	conf.Producer.Flush.Frequency = 500 * time.Millisecond
	producer, err := sarama.NewSyncProducer([]string{bootstrap}, conf)
	check(err, "producer")
	summary := map[string]interface{}{"codec": codec}
	if err := producer.SendMessages(msgs); err != nil {
		summary["produceErrors"] = errorTexts(err)
		check(producer.Close(), "close producer")
		return summary
	}
	check(producer.Close(), "close producer")
	acked := [][]int64{}
	for _, m := range msgs {
		acked = append(acked, []int64{int64(m.Partition), m.Offset, millis(m.Timestamp)})
	}
	summary["acked"] = acked
	summary["records"], summary["consumeErrors"] = consumePartition(bootstrap, topic, len(msgs))
	return summary
}

// consumeOnly reads records another client produced (zstd ones, which this sarama cannot send).
func consumeOnly(bootstrap string, args []string) map[string]interface{} {
	records, errs := consumePartition(bootstrap, args[0], atoi(args[1]))
	return map[string]interface{}{"records": records, "consumeErrors": errs}
}

// idempotent: Producer.Idempotent with one request in flight, small requests interleaving the
// partitions, then every record read back.
func idempotent(bootstrap string, args []string) map[string]interface{} {
	topic, partitions, per := args[0], atoi(args[1]), atoi(args[2])
	createTopic(bootstrap, topic, partitions)
	conf := newConfig()
	conf.Producer.Idempotent = true
	conf.Net.MaxOpenRequests = 1
	conf.Producer.Retry.Max = 5
	conf.Producer.Flush.MaxMessages = 20
	producer, err := sarama.NewSyncProducer([]string{bootstrap}, conf)
	check(err, "idempotent producer")
	var msgs []*sarama.ProducerMessage
	for i := 0; i < per; i++ {
		for p := 0; p < partitions; p++ {
			msgs = append(msgs, &sarama.ProducerMessage{Topic: topic, Partition: int32(p),
				Value: sarama.StringEncoder(fmt.Sprintf("%d:%d", p, i))})
		}
	}
	summary := map[string]interface{}{}
	if err := producer.SendMessages(msgs); err != nil {
		summary["produceErrors"] = errorTexts(err)
	}
	check(producer.Close(), "close producer")
	acked := [][]interface{}{}
	for _, m := range msgs {
		if m.Offset >= 0 {
			v, _ := m.Value.Encode()
			acked = append(acked, []interface{}{m.Partition, m.Offset, string(v)})
		}
	}
	summary["acked"] = acked
	consumer, err := sarama.NewConsumer([]string{bootstrap}, newConfig())
	check(err, "consumer")
	defer consumer.Close()
	consumed := [][]interface{}{}
	for p := 0; p < partitions; p++ {
		pc, err := consumer.ConsumePartition(topic, int32(p), sarama.OffsetOldest)
		check(err, "consume partition")
		timeout := time.After(20 * time.Second)
	read:
		for n := 0; n < per; n++ {
			select {
			case m := <-pc.Messages():
				consumed = append(consumed, []interface{}{m.Partition, m.Offset, string(m.Value)})
			case <-timeout:
				break read
			}
		}
		pc.Close()
	}
	summary["consumed"] = consumed
	return summary
}

// -- consumer groups -------------------------------------------------------------------------

// ledger records what each member processed, and each member's claims per generation.
type ledger struct {
	mu     sync.Mutex
	rows   [][]interface{} // member, partition, offset, value
	claims map[string][]interface{}
	byPart map[int32]int
}

func newLedger() *ledger {
	return &ledger{rows: [][]interface{}{}, claims: map[string][]interface{}{},
		byPart: map[int32]int{}}
}

func (l *ledger) add(member string, m *sarama.ConsumerMessage) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.rows = append(l.rows, []interface{}{member, m.Partition, m.Offset, string(m.Value)})
	l.byPart[m.Partition]++
}

func (l *ledger) count() (rows int, parts map[int32]int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	parts = map[int32]int{}
	for p, n := range l.byPart {
		parts[p] = n
	}
	return len(l.rows), parts
}

// handler processes (records and marks) the records its filter accepts, as a group member.
type handler struct {
	member string
	ledger *ledger
	accept func(*sarama.ConsumerMessage) bool
	// generation and claims of the member's latest session
	mu         sync.Mutex
	generation int32
	claimed    []int32
	initial    map[int32]int64
}

func (h *handler) Setup(s sarama.ConsumerGroupSession) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.generation = s.GenerationID()
	h.claimed = []int32{}
	for _, ps := range s.Claims() {
		h.claimed = append(h.claimed, ps...)
	}
	sort.Slice(h.claimed, func(i, j int) bool { return h.claimed[i] < h.claimed[j] })
	h.ledger.mu.Lock()
	h.ledger.claims[h.member] = append(h.ledger.claims[h.member],
		map[string]interface{}{"generation": h.generation, "partitions": h.claimed})
	h.ledger.mu.Unlock()
	return nil
}

func (h *handler) Cleanup(sarama.ConsumerGroupSession) error { return nil }

func (h *handler) ConsumeClaim(s sarama.ConsumerGroupSession, c sarama.ConsumerGroupClaim) error {
	h.mu.Lock()
	if h.initial == nil {
		h.initial = map[int32]int64{}
	}
	if _, seen := h.initial[c.Partition()]; !seen {
		h.initial[c.Partition()] = c.InitialOffset()
	}
	h.mu.Unlock()
	for {
		select {
		case m, ok := <-c.Messages():
			if !ok {
				return nil
			}
			if h.accept(m) {
				h.ledger.add(h.member, m)
				s.MarkMessage(m, "")
			}
		case <-s.Context().Done():
			return nil
		}
	}
}

func (h *handler) session() (int32, []int32) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.generation, h.claimed
}

// problems collects the errors the client reports, from any goroutine.
type problems struct {
	mu   sync.Mutex
	list []string
}

func (p *problems) add(err error, context string) {
	if err == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.list = append(p.list, context+err.Error())
}

func (p *problems) all() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string{}, p.list...)
}

// member is one ConsumerGroup consuming in a loop (one Consume call per generation) until
// stopped, then closed (which commits what was marked and leaves the group).
type member struct {
	group  sarama.ConsumerGroup
	cancel context.CancelFunc
	done   chan struct{}
}

func startMember(bootstrap, topic, group string, conf *sarama.Config, h *handler,
	errs *problems) *member {
	g, err := sarama.NewConsumerGroup([]string{bootstrap}, group, conf)
	check(err, "consumer group")
	ctx, cancel := context.WithCancel(context.Background())
	m := &member{group: g, cancel: cancel, done: make(chan struct{})}
	go func() {
		for e := range g.Errors() {
			errs.add(e, h.member+": ")
		}
	}()
	go func() {
		defer close(m.done)
		for ctx.Err() == nil {
			if err := g.Consume(ctx, []string{topic}, h); err != nil {
				errs.add(err, h.member+": consume: ")
				time.Sleep(200 * time.Millisecond)
			}
		}
	}()
	return m
}

func (m *member) stop() error {
	m.cancel()
	<-m.done
	return m.group.Close()
}

func waitFor(what string, timeout time.Duration, ok func() bool) error {
	end := time.Now().Add(timeout)
	for !ok() {
		if time.Now().After(end) {
			return fmt.Errorf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return nil
}

// produceNumbered sends n records to each partition, values "p:i" for i from first.
func produceNumbered(bootstrap, topic string, partitions, first, n int) {
	producer, err := sarama.NewSyncProducer([]string{bootstrap}, newConfig())
	check(err, "producer")
	var msgs []*sarama.ProducerMessage
	for p := 0; p < partitions; p++ {
		for i := first; i < first+n; i++ {
			msgs = append(msgs, &sarama.ProducerMessage{Topic: topic, Partition: int32(p),
				Key:   sarama.StringEncoder(fmt.Sprintf("k%d", i)),
				Value: sarama.StringEncoder(fmt.Sprintf("%d:%d", p, i))})
		}
	}
	if err := producer.SendMessages(msgs); err != nil {
		fail("produce: " + strings.Join(errorTexts(err), "; "))
	}
	check(producer.Close(), "close producer")
}

// committed: the group's committed offset of each partition, through the cluster admin
// (OffsetFetch v1), and the group's state (DescribeGroups v0).
func committed(bootstrap, topic, group string, partitions int) (map[string]int64, string) {
	admin, err := sarama.NewClusterAdmin([]string{bootstrap}, newConfig())
	check(err, "cluster admin")
	defer admin.Close()
	ps := []int32{}
	for p := 0; p < partitions; p++ {
		ps = append(ps, int32(p))
	}
	resp, err := admin.ListConsumerGroupOffsets(group, map[string][]int32{topic: ps})
	check(err, "list consumer group offsets")
	out := map[string]int64{}
	for _, p := range ps {
		if b := resp.GetBlock(topic, p); b != nil {
			out[strconv.Itoa(int(p))] = b.Offset
		}
	}
	desc, err := admin.DescribeConsumerGroups([]string{group})
	check(err, "describe consumer groups")
	return out, desc[0].State
}

func highWatermarks(bootstrap, topic string, partitions int) map[string]int64 {
	client, err := sarama.NewClient([]string{bootstrap}, newConfig())
	check(err, "client")
	defer client.Close()
	out := map[string]int64{}
	for p := 0; p < partitions; p++ {
		hw, err := client.GetOffset(topic, int32(p), sarama.OffsetNewest)
		check(err, "list offsets")
		out[strconv.Itoa(p)] = hw
	}
	return out
}

// resume: a member processes (and commits) the first part of each partition and closes; a new
// member of the same group resumes from the committed offsets and processes the rest. An
// optional sixth argument sets Consumer.Offsets.Retention in ms; 0 is sarama's default, with
// which it commits through OffsetCommit v1.
func resume(bootstrap string, args []string) map[string]interface{} {
	topic, group := args[0], args[1]
	partitions, per, part := atoi(args[2]), atoi(args[3]), atoi(args[4])
	conf := newConfig()
	if len(args) > 5 {
		conf.Consumer.Offsets.Retention = time.Duration(atoi(args[5])) * time.Millisecond
	}
	createTopic(bootstrap, topic, partitions)
	produceNumbered(bootstrap, topic, partitions, 0, per)
	errs := &problems{}

	first := newLedger()
	h1 := &handler{member: "first", ledger: first,
		accept: func(m *sarama.ConsumerMessage) bool { return m.Offset < int64(part) }}
	m1 := startMember(bootstrap, topic, group, conf, h1, errs)
	errs.add(waitFor("the first part consumed", 30*time.Second, func() bool {
		_, parts := first.count()
		done := 0
		for _, n := range parts {
			if n >= part {
				done++
			}
		}
		return done == partitions
	}), "")
	errs.add(m1.stop(), "first: close: ")
	afterFirst, stateAfterFirst := committed(bootstrap, topic, group, partitions)

	second := newLedger()
	h2 := &handler{member: "second", ledger: second,
		accept: func(*sarama.ConsumerMessage) bool { return true }}
	m2 := startMember(bootstrap, topic, group, conf, h2, errs)
	errs.add(waitFor("the rest consumed", 30*time.Second, func() bool {
		n, _ := second.count()
		return n >= partitions*(per-part)
	}), "")
	time.Sleep(300 * time.Millisecond) // anything arriving now would be a duplicate
	errs.add(m2.stop(), "second: close: ")
	afterSecond, stateAfterSecond := committed(bootstrap, topic, group, partitions)
	initial := map[string]int64{}
	h2.mu.Lock()
	for p, o := range h2.initial {
		initial[strconv.Itoa(int(p))] = o
	}
	h2.mu.Unlock()
	return map[string]interface{}{
		"first":                 first.rows,
		"second":                second.rows,
		"secondInitialOffsets":  initial,
		"committedAfterFirst":   afterFirst,
		"committedAfterSecond":  afterSecond,
		"groupStateAfterFirst":  stateAfterFirst,
		"groupStateAfterSecond": stateAfterSecond,
		"highWatermarks":        highWatermarks(bootstrap, topic, partitions),
		"errors":                errs.all(),
	}
}

// share: two members join one group and share the partitions; once both hold partitions of the
// same generation, a first half of the records is produced and processed, each record by the
// member that holds its partition. Then member-1 leaves: member-0 takes every partition over
// from the committed offsets and processes the second half.
func share(bootstrap string, args []string) map[string]interface{} {
	topic, group := args[0], args[1]
	partitions, per := atoi(args[2]), atoi(args[3])
	createTopic(bootstrap, topic, partitions)
	errs := &problems{}
	l := newLedger()
	handlers := []*handler{}
	members := []*member{}
	for _, name := range []string{"member-0", "member-1"} {
		h := &handler{member: name, ledger: l,
			accept: func(*sarama.ConsumerMessage) bool { return true }}
		handlers = append(handlers, h)
		members = append(members, startMember(bootstrap, topic, group, newConfig(), h, errs))
	}
	stable := map[string]interface{}{}
	var generation int32
	errs.add(waitFor("both members holding partitions of one generation", 30*time.Second,
		func() bool {
			g0, c0 := handlers[0].session()
			g1, c1 := handlers[1].session()
			if g0 == 0 || g0 != g1 || len(c0) == 0 || len(c1) == 0 ||
				len(c0)+len(c1) != partitions {
				return false
			}
			generation = g0
			stable = map[string]interface{}{"generation": g0, "member-0": c0, "member-1": c1}
			return true
		}), "")
	_, stateLive := committed(bootstrap, topic, group, partitions)
	produceNumbered(bootstrap, topic, partitions, 0, per)
	errs.add(waitFor("the first half consumed", 30*time.Second, func() bool {
		n, _ := l.count()
		return n >= partitions*per
	}), "")

	errs.add(members[1].stop(), "member-1: close: ")
	afterLeave, _ := committed(bootstrap, topic, group, partitions)
	takeover := map[string]interface{}{}
	errs.add(waitFor("member-0 holding every partition", 30*time.Second, func() bool {
		g, c := handlers[0].session()
		takeover = map[string]interface{}{"generation": g, "partitions": c}
		return g > generation && len(c) == partitions
	}), "")
	produceNumbered(bootstrap, topic, partitions, per, per)
	errs.add(waitFor("the second half consumed", 30*time.Second, func() bool {
		n, _ := l.count()
		return n >= 2*partitions*per
	}), "")
	time.Sleep(500 * time.Millisecond) // anything arriving now would be a duplicate
	errs.add(members[0].stop(), "member-0: close: ")
	final, stateAfter := committed(bootstrap, topic, group, partitions)
	l.mu.Lock()
	defer l.mu.Unlock()
	return map[string]interface{}{
		"stable":               stable,
		"takeover":             takeover,
		"claims":               l.claims,
		"rows":                 l.rows,
		"committedAfterLeave":  afterLeave,
		"committedAfterClose":  final,
		"groupStateLive":       stateLive,
		"groupStateAfterClose": stateAfter,
		"highWatermarks":       highWatermarks(bootstrap, topic, partitions),
		"errors":               errs.all(),
	}
}
