package table

import (
	"encoding/json"
	"errors"
	"fmt"
)

// recordV1 prefixes a persisted record: a codec change gets a new prefix,
// and records with an unknown one are skipped rather than misread.
const recordV1 = 'j'

// EncodePod is the persisted form of a record.
func EncodePod(p *Pod) ([]byte, error) {
	b, err := json.Marshal(p)
	if err != nil {
		return nil, err
	}
	return append([]byte{recordV1}, b...), nil
}

// DecodePod reads a persisted record. It checks the shape, not the content:
// callers check the record against the source it was stored under.
func DecodePod(b []byte) (*Pod, error) {
	if len(b) == 0 {
		return nil, errors.New("empty record")
	}
	if b[0] != recordV1 {
		return nil, fmt.Errorf("unknown record version %q", b[0])
	}
	p := new(Pod)
	if err := json.Unmarshal(b[1:], p); err != nil {
		return nil, err
	}
	if p.Cluster == "" || p.Namespace == "" || p.Name == "" {
		return nil, errors.New("record without cluster, namespace or name")
	}
	return p, nil
}
