// Command kafkago drives segmentio's kafka-go, as Debian 12 packages it
// (golang-github-segmentio-kafka-go-dev 0.2.1), against a broker:
//
//	kafkago <bootstrap> metadata <topic> <doomed topic>
//	kafkago <bootstrap> produce <codec> <topic>
//	kafkago <bootstrap> fetch <topic> <count>
//	kafkago <bootstrap> group <topic> <group> <partitions> <commit offset>
//
// It prints one JSON line on stdout saying what the client saw; it judges nothing (the pytest
// side does). Exit code 0 when the scenario ran to its end (errors the client reported are in
// the summary), 2 when it could not.
//
// This kafka-go writes its request versions into each call: Produce v2 with message format v1
// (so no headers) and Fetch v2, which Kafka 4 no longer serves, and CreateTopics v0, also gone;
// Metadata v1, ListOffsets v1, DeleteTopics v1, FindCoordinator v0, JoinGroup v1, SyncGroup v0,
// Heartbeat v0, LeaveGroup v0, OffsetCommit v2 and OffsetFetch v1, which it still serves.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	kafka "github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/gzip"
	"github.com/segmentio/kafka-go/lz4"
	"github.com/segmentio/kafka-go/snappy"
)

// clientVersion is the Debian package's version, set at build time by install.sh.
var clientVersion = "unknown"

const deadline = 60 * time.Second

var dialer = &kafka.Dialer{ClientID: "mini-broker-conformance", Timeout: 5 * time.Second}

func main() {
	if len(os.Args) < 3 {
		fail("usage: kafkago <bootstrap> <scenario> <args...>")
	}
	time.AfterFunc(deadline, func() { fail(fmt.Sprintf("no result after %s", deadline)) })
	bootstrap, scenario, args := os.Args[1], os.Args[2], os.Args[3:]
	run := map[string]func(string, []string) map[string]interface{}{
		"metadata": metadata,
		"produce":  produce,
		"fetch":    fetch,
		"group":    group,
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
	fmt.Fprintln(os.Stderr, "kafkago:", why)
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

func errText(err error) interface{} {
	if err == nil {
		return nil
	}
	return err.Error()
}

func leader(bootstrap, topic string, partition int) *kafka.Conn {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := dialer.DialLeader(ctx, "tcp", bootstrap, topic, partition)
	check(err, "dial the leader")
	check(conn.SetDeadline(time.Now().Add(15*time.Second)), "deadline")
	return conn
}

func dial(bootstrap string) *kafka.Conn {
	conn, err := dialer.Dial("tcp", bootstrap)
	check(err, "dial")
	check(conn.SetDeadline(time.Now().Add(15*time.Second)), "deadline")
	return conn
}

// metadata: what this kafka-go can learn and change about topics. The topic exists with 3
// partitions; the doomed topic exists and is deleted.
func metadata(bootstrap string, args []string) map[string]interface{} {
	topic, doomed := args[0], args[1]
	summary := map[string]interface{}{}
	conn := dial(bootstrap)
	partitions, err := conn.ReadPartitions(topic)
	summary["partitionsError"] = errText(err)
	ids := []int{}
	leaders := map[string]string{}
	for _, p := range partitions {
		ids = append(ids, p.ID)
		leaders[strconv.Itoa(p.ID)] = fmt.Sprintf("%s:%d", p.Leader.Host, p.Leader.Port)
	}
	sort.Ints(ids)
	summary["partitions"], summary["leaders"] = ids, leaders
	conn.Close()

	first, last, err := leader(bootstrap, topic, 0).ReadOffsets()
	summary["offsets"], summary["offsetsError"] = []int64{first, last}, errText(err)

	conn = dial(bootstrap)
	summary["deleteError"] = errText(conn.DeleteTopics(doomed))
	conn.Close()

	conn = dial(bootstrap)
	created := doomed + "-kafka-go"
	summary["createError"] = errText(conn.CreateTopics(
		kafka.TopicConfig{Topic: created, NumPartitions: 1, ReplicationFactor: 1}))
	summary["createdTopic"] = created
	conn.Close()
	return summary
}

var codecs = map[string]kafka.CompressionCodec{
	"none":   nil,
	"gzip":   gzip.NewCompressionCodec(),
	"snappy": snappy.NewCompressionCodec(),
	"lz4":    lz4.NewCompressionCodec(),
}

// produce: keyed records with CreateTime timestamps (this kafka-go's messages carry no
// headers), written to partition 0 of the topic with the codec.
func produce(bootstrap string, args []string) map[string]interface{} {
	name, topic := args[0], args[1]
	codec, known := codecs[name]
	if !known {
		fail("this kafka-go has no codec " + name)
	}
	base := time.Now().Add(-time.Hour).Truncate(time.Millisecond)
	msgs := []kafka.Message{
		{Key: []byte("key-0"), Value: bytes.Repeat([]byte("compressible "), 200), Time: base},
		{Key: nil, Value: []byte("value with a null key"), Time: base.Add(time.Second)},
		{Key: []byte{0, 1, 2, 255}, Value: []byte{}, Time: base.Add(2 * time.Second)},
	}
	conn := leader(bootstrap, topic, 0)
	defer conn.Close()
	n, err := conn.WriteCompressedMessages(codec, msgs...)
	return map[string]interface{}{"codec": name, "written": n, "produceError": errText(err)}
}

// fetch: the topic's offsets (ListOffsets v1), then a read from the first one (Fetch v2).
func fetch(bootstrap string, args []string) map[string]interface{} {
	topic, count := args[0], atoi(args[1])
	conn := leader(bootstrap, topic, 0)
	defer conn.Close()
	first, last, err := conn.ReadOffsets()
	summary := map[string]interface{}{"offsets": []int64{first, last}, "offsetsError": errText(err)}
	_, err = conn.Seek(first, kafka.SeekAbsolute)
	summary["seekError"] = errText(err)
	read := [][]interface{}{}
	var readErr error
	for len(read) < count {
		m, err := conn.ReadMessage(1 << 20)
		if err != nil {
			readErr = err
			break
		}
		read = append(read, []interface{}{m.Offset, string(m.Key), string(m.Value)})
	}
	summary["records"], summary["readError"] = read, errText(readErr)
	return summary
}

// -- consumer groups -------------------------------------------------------------------------

// journal collects a Reader's log lines, for what it learned from the coordinator: the offsets
// it starts each assigned partition at.
type journal struct {
	mu    sync.Mutex
	lines []string
}

func (j *journal) Write(p []byte) (int, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.lines = append(j.lines, strings.TrimRight(string(p), "\n"))
	fmt.Fprintf(os.Stderr, "[kafka-go] %s", p)
	return len(p), nil
}

var subscribed = regexp.MustCompile(`subscribed to partitions: map\[(.*)\]`)

// subscriptions: every assignment the Reader took, as partition -> starting offset.
func (j *journal) subscriptions() []map[string]int64 {
	j.mu.Lock()
	defer j.mu.Unlock()
	out := []map[string]int64{}
	for _, line := range j.lines {
		match := subscribed.FindStringSubmatch(line)
		if match == nil {
			continue
		}
		offsets := map[string]int64{}
		for _, pair := range strings.Fields(match[1]) {
			kv := strings.SplitN(pair, ":", 2)
			o, err := strconv.ParseInt(kv[1], 10, 64)
			check(err, "offset in "+line)
			offsets[kv[0]] = o
		}
		out = append(out, offsets)
	}
	return out
}

// fetchGrace: how long a member lives after its assignment before it commits or closes, so
// that its readers' fetches reach the broker.
const fetchGrace = time.Second

func newMember(bootstrap, topic, group string) (*kafka.Reader, *journal) {
	j := &journal{}
	logger := log.New(j, "", 0)
	r := kafka.NewReader(kafka.ReaderConfig{
		Brokers:           []string{bootstrap},
		GroupID:           group,
		Topic:             topic,
		Dialer:            dialer,
		MaxWait:           100 * time.Millisecond,
		HeartbeatInterval: 300 * time.Millisecond,
		SessionTimeout:    6 * time.Second,
		RebalanceTimeout:  5 * time.Second,
		CommitInterval:    0, // CommitMessages commits synchronously
		Logger:            logger,
		ErrorLogger:       logger,
	})
	return r, j
}

func waitSubscribed(j *journal, timeout time.Duration) (map[string]int64, error) {
	end := time.Now().Add(timeout)
	for time.Now().Before(end) {
		if subs := j.subscriptions(); len(subs) > 0 {
			return subs[len(subs)-1], nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return nil, fmt.Errorf("no assignment after %s", timeout)
}

// group: a member joins, takes every partition and commits `commit` on each (as though it had
// processed the records before it: this kafka-go cannot fetch them), then closes; a new member
// of the group joins and starts each partition where the commits say.
func group(bootstrap string, args []string) map[string]interface{} {
	topic, groupID := args[0], args[1]
	partitions, commit := atoi(args[2]), int64(atoi(args[3]))
	summary := map[string]interface{}{}

	first, j1 := newMember(bootstrap, topic, groupID)
	assigned, err := waitSubscribed(j1, 20*time.Second)
	summary["firstAssignment"], summary["firstJoinError"] = assigned, errText(err)
	// The Reader's partition readers fetch in the background (Fetch v2, refused); a broker
	// that answers the commit at once would otherwise see the member close before any fetch
	// went out, so what the broker refuses would depend on its speed.
	time.Sleep(fetchGrace)
	processed := []kafka.Message{}
	for p := 0; p < partitions; p++ {
		processed = append(processed, kafka.Message{Topic: topic, Partition: p, Offset: commit - 1})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	summary["commitError"] = errText(first.CommitMessages(ctx, processed...))
	cancel()
	summary["firstCloseError"] = errText(first.Close())

	second, j2 := newMember(bootstrap, topic, groupID)
	assigned, err = waitSubscribed(j2, 20*time.Second)
	summary["secondAssignment"], summary["secondJoinError"] = assigned, errText(err)
	time.Sleep(fetchGrace)
	summary["secondCloseError"] = errText(second.Close())
	return summary
}
