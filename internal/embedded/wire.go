package embedded

import (
	"encoding/binary"
	"fmt"
	"io"
	"strings"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// Wire protocol constants (MongoDB's OP_MSG specification).
const (
	opMsg           = 2013
	headerLen       = 16
	flagChecksum    = 1 << 0
	flagMoreToCome  = 1 << 1
	maxMessageBytes = 64 << 20 // above MongoDB's 48 MB maxMessageSizeBytes
)

// readMessage reads one whole wire-protocol message.
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

func opCode(msg []byte) int32 { return int32(binary.LittleEndian.Uint32(msg[12:16])) }

func msgFlags(msg []byte) uint32 {
	if len(msg) < headerLen+4 {
		return 0
	}
	return binary.LittleEndian.Uint32(msg[16:20])
}

// command is what the funnel needs of a request: the command's name (the
// body's first key), its database and the collection it names.
type command struct {
	name, db, collection string
}

// sections calls fn with each section of an OP_MSG, its kind and its
// bounds in msg: [from, to) holds the body document (kind 0) or the size,
// identifier and documents of a document sequence (kind 1), until fn
// returns false. It returns false when msg is not a well-formed OP_MSG.
func sections(msg []byte, fn func(kind byte, from, to int) bool) bool {
	if opCode(msg) != opMsg || len(msg) < headerLen+5 {
		return false
	}
	end := len(msg)
	if msgFlags(msg)&flagChecksum != 0 {
		end -= 4
	}
	for p := headerLen + 4; p < end; {
		kind := msg[p]
		p++
		if p+4 > end {
			return false
		}
		size := int(int32(binary.LittleEndian.Uint32(msg[p:])))
		if size < 5 || p+size > end {
			return false
		}
		if !fn(kind, p, p+size) {
			return true
		}
		p += size
	}
	return true
}

// parseCommand reads an OP_MSG's body section (kind 0). Other op codes
// (the legacy OP_QUERY of a first handshake) are not commands to funnel.
func parseCommand(msg []byte) (cmd command, ok bool) {
	sections(msg, func(kind byte, from, to int) bool {
		if kind != 0 {
			return true
		}
		body := bson.Raw(msg[from:to])
		elems, err := body.Elements()
		if err != nil || len(elems) == 0 {
			return false
		}
		cmd = command{name: elems[0].Key()}
		cmd.collection, _ = elems[0].Value().StringValueOK()
		cmd.db, _ = body.Lookup("$db").StringValueOK()
		if strings.EqualFold(cmd.name, "renameCollection") {
			// {renameCollection: "db.from", to: "db.to"}, sent to admin.
			cmd.db, cmd.collection, _ = strings.Cut(cmd.collection, ".")
		}
		ok = true
		return false
	})
	return cmd, ok
}
