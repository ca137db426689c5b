package embedded

import (
	"encoding/binary"
	"slices"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// TestWithoutPartialFiltersKeepsTheMessage: the rewritten createIndexes
// keeps the request's id and its other flags, drops the checksum (it
// would no longer match) and parses again; one with a document sequence,
// which the driver does not send, is left as it is.
func TestWithoutPartialFiltersKeepsTheMessage(t *testing.T) {
	index := bson.D{{Key: "key", Value: bson.D{{Key: "status", Value: 1}}}, {Key: "name", Value: "status_1"}, {Key: "unique", Value: true},
		{Key: "partialFilterExpression", Value: bson.D{{Key: "status", Value: bson.D{{Key: "$exists", Value: true}}}}}}
	body := bson.D{{Key: "createIndexes", Value: "c"}, {Key: "indexes", Value: bson.A{index}}, {Key: "$db", Value: "d"}}
	req := opMsgOf(t, body, "")
	binary.LittleEndian.PutUint32(req[4:], 42) // requestID
	binary.LittleEndian.PutUint32(req[16:], flagChecksum|flagMoreToCome)
	req = binary.LittleEndian.AppendUint32(req, 0xdeadbeef)
	binary.LittleEndian.PutUint32(req, uint32(len(req)))

	cmd, ok := parseCommand(req)
	if !ok || cmd.name != "createIndexes" || cmd.db != "d" || cmd.collection != "c" {
		t.Fatalf("parseCommand = %+v, %v", cmd, ok)
	}
	out := withoutPartialFilters(req, cmd.msg)
	if requestID(out) != 42 || msgFlags(out) != flagMoreToCome {
		t.Errorf("request id %d, flags %b; want 42, moreToCome alone", requestID(out), msgFlags(out))
	}
	m := parseOpMsg(out)
	if m == nil || int(binary.LittleEndian.Uint32(out)) != len(out) {
		t.Fatal("the rewritten message does not parse")
	}
	if _, err := m.body().LookupErr("indexes", "0", "partialFilterExpression"); err == nil {
		t.Error("the partial filter is still there")
	}

	seq := opMsgOf(t, body, "extra", bson.D{{Key: "_id", Value: 1}})
	if cmd, _ := parseCommand(seq); !slices.Equal(withoutPartialFilters(seq, cmd.msg), seq) {
		t.Error("a request with a document sequence was rewritten")
	}
}

// TestParseOpMsgRefusesMalformed: a message that is not a well-formed
// OP_MSG is no command, whatever its bytes, and never a panic.
func TestParseOpMsgRefusesMalformed(t *testing.T) {
	good := opMsgOf(t, bson.D{{Key: "insert", Value: "c"}, {Key: "$db", Value: "d"}}, "documents", bson.D{{Key: "_id", Value: 1}})
	checksumWithoutRoom := slices.Clone(good)
	binary.LittleEndian.PutUint32(checksumWithoutRoom[16:], flagChecksum)
	unknownKind := slices.Clone(good)
	unknownKind[20] = 7
	for name, msg := range map[string][]byte{
		"truncated":                  good[:len(good)-3],
		"checksum flag, no room":     checksumWithoutRoom,
		"unknown section kind":       unknownKind,
		"sequence size past the end": append(slices.Clone(good[:len(good)-1]), 0xff),
	} {
		if m := parseOpMsg(msg); m != nil {
			t.Errorf("%s: parsed as %+v", name, m)
		}
	}
	if m := parseOpMsg(good); m == nil || m.body() == nil || len(m.seqs["documents"]) != 1 {
		t.Error("the well-formed insert does not parse as its body and one document")
	}
}

func FuzzParseOpMsg(f *testing.F) {
	f.Add(opMsgOf(&testing.T{}, bson.D{{Key: "update", Value: "c"}}, "updates", bson.D{{Key: "q", Value: bson.D{}}}))
	f.Fuzz(func(t *testing.T, msg []byte) {
		if m := parseOpMsg(msg); m != nil {
			guardedUpdates(m)
		}
	})
}
