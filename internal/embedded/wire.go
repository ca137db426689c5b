package embedded

import (
	"encoding/binary"
	"fmt"
	"io"
	"net"

	"github.com/FerretDB/wire"
	"github.com/FerretDB/wire/wirebson"
	"go.mongodb.org/mongo-driver/v2/bson"
)

// Wire protocol constants (MongoDB's OP_MSG specification), from
// github.com/FerretDB/wire, the package FerretDB reads its messages with.
const (
	headerLen       = wire.MsgHeaderLen
	flagChecksum    = uint32(wire.OpMsgChecksumPresent)
	flagMoreToCome  = uint32(wire.OpMsgMoreToCome)
	maxMessageBytes = 64 << 20 // above MongoDB's 48 MB maxMessageSizeBytes
)

// readMessage reads one whole wire-protocol message, as bytes. Not
// wire.ReadMessage (v0.0.7), which returns only the decoded body (the
// funnel forwards bytes), decodes every document of every reply, and
// refuses op codes the funnel leaves to FerretDB (OP_COMPRESSED, ...).
func readMessage(r io.Reader) ([]byte, error) {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return nil, err
	}
	n := int(int32(binary.LittleEndian.Uint32(hdr[:])))
	if n < headerLen || n > maxMessageBytes {
		return nil, fmt.Errorf("wire message of %d bytes", n)
	}
	msg := make([]byte, n)
	copy(msg, hdr[:])
	if _, err := io.ReadFull(r, msg[4:]); err != nil {
		return nil, err
	}
	return msg, nil
}

// The header's fields are read by hand: wire v0.0.7 decodes a MsgHeader
// only inside ReadMessage.

func opCode(msg []byte) wire.OpCode { return wire.OpCode(binary.LittleEndian.Uint32(msg[12:16])) }

func requestID(msg []byte) int32 { return int32(binary.LittleEndian.Uint32(msg[4:8])) }

func msgFlags(msg []byte) uint32 {
	if len(msg) < headerLen+4 {
		return 0
	}
	return binary.LittleEndian.Uint32(msg[16:20])
}

// opMsg is an OP_MSG's flags, its body (the kind-0 section) and its
// document sequences (kind-1 sections) by identifier, parsed once per
// request.
type opMsg struct {
	flags uint32
	doc   bson.Raw
	seqs  map[string][]bson.Raw
}

// body is the command's body; nil for a nil m.
func (m *opMsg) body() bson.Raw {
	if m == nil {
		return nil
	}
	return m.doc
}

// parseOpMsg splits an OP_MSG into its sections without copying them; nil
// when msg is not a well-formed OP_MSG (at most one body).
// Not wire.OpMsg.UnmarshalBinaryNocopy: at v0.0.7 it also decodes every
// document (FerretDB/wire#7), 29 times the time of this parse on a
// 200-document insert (docs/embedded-store.md, "Why the funnel parses
// OP_MSG itself").
func parseOpMsg(msg []byte) *opMsg {
	if len(msg) < headerLen+5 || opCode(msg) != wire.OpCodeMsg {
		return nil
	}
	m := &opMsg{flags: msgFlags(msg)}
	end := len(msg)
	if m.flags&flagChecksum != 0 {
		end -= 4
	}
	for p := headerLen + 4; p < end; {
		kind := msg[p]
		p++
		switch kind {
		case 0:
			l, err := wirebson.FindRaw(msg[p:end])
			if err != nil || m.doc != nil {
				return nil
			}
			m.doc = msg[p : p+l]
			p += l
		case 1:
			// int32 size (itself included), cstring identifier, documents.
			if p+4 > end {
				return nil
			}
			size := int(int32(binary.LittleEndian.Uint32(msg[p:])))
			if size < 5 || p+size > end {
				return nil
			}
			seq := msg[p+4 : p+size]
			id, err := wirebson.DecodeCString(seq)
			if err != nil {
				return nil
			}
			if m.seqs == nil {
				m.seqs = map[string][]bson.Raw{}
			}
			for docs := seq[wirebson.SizeCString(id):]; len(docs) > 0; {
				l, err := wirebson.FindRaw(docs)
				if err != nil {
					return nil
				}
				m.seqs[id] = append(m.seqs[id], bson.Raw(docs[:l]))
				docs = docs[l:]
			}
			p += size
		default:
			return nil
		}
	}
	return m
}

// command is what the funnel needs of a request: the command's name (the
// body's first key), its database, the collection it names, and the
// parsed message.
type command struct {
	name, db, collection string
	msg                  *opMsg
}

// parseCommand reads an OP_MSG's body section (kind 0). Other op codes
// (the legacy OP_QUERY of a first handshake) are not commands to funnel.
func parseCommand(msg []byte) (cmd command, ok bool) {
	m := parseOpMsg(msg)
	body := m.body()
	elems, err := body.Elements() // none for a nil body (not an OP_MSG)
	if err != nil || len(elems) == 0 {
		return command{}, false
	}
	cmd = command{name: elems[0].Key(), msg: m}
	cmd.collection, _ = elems[0].Value().StringValueOK()
	cmd.db, _ = body.Lookup("$db").StringValueOK()
	return cmd, true
}

// refusal is a command error answer, as MongoDB words it.
func refusal(code int32, codeName, msg string) bson.D {
	return bson.D{{Key: "ok", Value: 0.0}, {Key: "errmsg", Value: msg}, {Key: "code", Value: code}, {Key: "codeName", Value: codeName}}
}

// answer sends the funnel's own reply (a document) to the request req
// (parsed as cmd), unless the client asked for none (moreToCome).
func answer(c net.Conn, req []byte, cmd command, body any) error {
	if cmd.msg.flags&flagMoreToCome != 0 {
		return nil
	}
	raw, err := bson.Marshal(body)
	if err != nil {
		return err
	}
	_, err = c.Write(opMessage(raw, requestID(req)))
	return err
}
