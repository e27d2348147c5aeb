package annotation

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// StaleEndpointsAnnotation on an exported Service or its ServiceExport (the
// ServiceExport's when both have it) says what consumers do with the
// service's endpoints in a cluster they cannot reach, the export entry
// carrying it (Service.StaleEndpoints, signed with the rest):
//
//	serve                    serve them as last seen (the default)
//	drop-after=30s           drop them once the cluster has been out of contact that long
//	drop-if-local-after=30s  the same, only while the consumer has endpoints of its own
//
// A consumer may be stricter (its own expire), never looser.
const StaleEndpointsAnnotation = "multicluster.kubernetes.io/stale-endpoints"

// The values of Service.StaleEndpoints.
const (
	StaleServe       = "Serve" // also what an absent field means
	StaleDrop        = "Drop"
	StaleDropIfLocal = "DropIfLocal"
)

// MaxStaleGrace bounds the grace of a drop policy (seven days).
const MaxStaleGrace = 7 * 24 * 3600

// The words of StaleEndpointsAnnotation's value.
const (
	staleServeWord       = "serve"
	staleDropWord        = "drop-after="
	staleDropIfLocalWord = "drop-if-local-after="
)

// ParseStaleEndpoints reads the value of StaleEndpointsAnnotation into the
// entry's fields (policy "" for serve, the default, so that an entry says
// nothing it did not say before). The error says what is wrong and what is
// expected; nothing is guessed.
func ParseStaleEndpoints(value string) (policy string, graceSeconds int32, err error) {
	v := strings.TrimSpace(value)
	var word string
	switch {
	case v == staleServeWord:
		return "", 0, nil
	case strings.HasPrefix(v, staleDropIfLocalWord):
		policy, word = StaleDropIfLocal, staleDropIfLocalWord
	case strings.HasPrefix(v, staleDropWord):
		policy, word = StaleDrop, staleDropWord
	default:
		return "", 0, fmt.Errorf("%q: want serve, drop-after=DURATION or drop-if-local-after=DURATION", Clip(v))
	}
	d, err := time.ParseDuration(v[len(word):])
	switch {
	case err != nil:
		return "", 0, fmt.Errorf("%q: %s takes a duration such as 30s or 5m", Clip(v), strings.TrimSuffix(word, "="))
	case d < 0 || d > MaxStaleGrace*time.Second || d%time.Second != 0:
		return "", 0, fmt.Errorf("%q: the duration must be whole seconds from 0s to %s", Clip(v), time.Duration(MaxStaleGrace)*time.Second)
	}
	return policy, int32(d / time.Second), nil
}

// FormatStaleEndpoints writes an entry's policy as StaleEndpointsAnnotation's
// value ("serve" for the default).
func FormatStaleEndpoints(policy string, graceSeconds int32) string {
	grace := (time.Duration(graceSeconds) * time.Second).String()
	switch policy {
	case StaleDrop:
		return staleDropWord + grace
	case StaleDropIfLocal:
		return staleDropIfLocalWord + grace
	}
	return staleServeWord
}

// StalePolicy returns the entry's policy with its default.
func (s *Service) StalePolicy() string {
	if s.StaleEndpoints == "" {
		return StaleServe
	}
	return s.StaleEndpoints
}

// DropGrace is the grace after which the entry's policy drops the endpoints
// of a cluster out of contact, whether only while the consumer has ready
// endpoints of its own (DropIfLocal), and whether it drops them at all
// (false: Serve).
func (s *Service) DropGrace() (grace time.Duration, ifLocal, ok bool) {
	switch s.StaleEndpoints {
	case StaleDrop, StaleDropIfLocal:
		return time.Duration(s.StaleGraceSeconds) * time.Second, s.StaleEndpoints == StaleDropIfLocal, true
	}
	return 0, false, false
}

// DropsStale is the stale policy's rule, the same for DNS answers and for
// the MCS controller's EndpointSlices: whether the entry's endpoints of a
// cluster out of contact for outOfContact (0: in contact) are left out.
// hasLocal says whether the consumer has ready endpoints of the service of
// its own; it is called only for DropIfLocal, past the grace.
func (s *Service) DropsStale(outOfContact time.Duration, hasLocal func() bool) bool {
	grace, ifLocal, ok := s.DropGrace()
	return ok && outOfContact > grace && (!ifLocal || hasLocal())
}

// CheckStale is the error of an entry whose policy fields are not valid
// (what the parser rejects an entry for), nil if they are: for records read
// back from elsewhere than an annotation (a snapshot).
func (s *Service) CheckStale() error {
	if detail, bad := checkStale(s); bad {
		return errors.New(detail)
	}
	return nil
}

// checkStale validates an entry's policy fields.
func checkStale(s *Service) (string, bool) {
	switch s.StaleEndpoints {
	case "", StaleServe:
		if s.StaleGraceSeconds != 0 {
			return fmt.Sprintf("staleGraceSeconds %d: only with staleEndpoints %s or %s", s.StaleGraceSeconds, StaleDrop, StaleDropIfLocal), true
		}
	case StaleDrop, StaleDropIfLocal:
		if g := s.StaleGraceSeconds; g < 0 || g > MaxStaleGrace {
			return fmt.Sprintf("staleGraceSeconds %d: must be 0-%d", g, MaxStaleGrace), true
		}
	default:
		return fmt.Sprintf("staleEndpoints %q: must be %s, %s or %s", Clip(s.StaleEndpoints), StaleServe, StaleDrop, StaleDropIfLocal), true
	}
	return "", false
}
