package snapshot

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
)

// failWrites makes the store's writes fail until the returned function is
// called. Both ways are real bbolt failures, and both work as root (unlike
// chmod).
type failWrites func(t *testing.T, s *Store) (restore func())

// closeUnderneath closes the bolt DB under the store: writes fail with
// ErrDatabaseNotOpen. restore reopens it.
func closeUnderneath(t *testing.T, s *Store) func() {
	s.dbMu.Lock()
	defer s.dbMu.Unlock()
	if err := s.db.Close(); err != nil {
		t.Fatal(err)
	}
	return func() {
		s.dbMu.Lock()
		defer s.dbMu.Unlock()
		db, err := bolt.Open(s.path, fileMode, &bolt.Options{Timeout: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		s.db = db
	}
}

// capSize stops the file from growing, as a full disk does: bbolt fails
// the commit with ErrMaxSizeReached. restore lifts the cap.
func capSize(t *testing.T, s *Store) func() {
	s.dbMu.Lock()
	defer s.dbMu.Unlock()
	fi, err := os.Stat(s.path)
	if err != nil {
		t.Fatal(err)
	}
	s.db.MaxSize = int(fi.Size())
	return func() {
		s.dbMu.Lock()
		defer s.dbMu.Unlock()
		s.db.MaxSize = 0
	}
}

func TestWriteErrorsAreRetriedWithoutLoss(t *testing.T) {
	cases := []struct {
		name    string
		fail    failWrites
		wantErr error
	}{
		{"db closed underneath", closeUnderneath, berrors.ErrDatabaseNotOpen},
		{"file may not grow (disk full)", capSize, berrors.ErrMaxSizeReached},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var logs logBuf
			path := dbPath(t)
			o := testOptions(&logs)
			o.MaxRetryInterval = 40 * time.Millisecond
			s, _ := mustOpen(t, path, o)
			s.Put("local", "before", []byte("1"))
			if err := s.Flush(); err != nil {
				t.Fatal(err)
			}

			restore := tc.fail(t, s)
			big := bytes.Repeat([]byte("x"), 1000)
			for i := 0; i < 2000; i++ { // ~2MB: more than the file can hold
				s.Put("local", fmt.Sprintf("key-%04d", i), big)
			}
			s.ReplaceSource("peer", map[string][]byte{"p": []byte("1")}, Meta{ClusterID: "peer"})
			if err := s.Flush(); !errors.Is(err, tc.wantErr) {
				t.Fatalf("Flush = %v, want %v", err, tc.wantErr)
			}
			// The batcher keeps retrying on its own, with backoff.
			waitFor(t, 5*time.Second, "background retries", func() bool { return s.Stats().WriteErrors >= 4 })
			// Changes made while writes fail are kept too, and win.
			s.Put("local", "key-0000", []byte("newer"))
			s.Delete("local", "before")
			st := s.Stats()
			// 2000 puts + 1 delete in local, a replace (reset, meta, one
			// record) in peer; key-0000 counts twice if a retry is running.
			if !errors.Is(st.LastError, tc.wantErr) || st.Pending < 2004 || st.Pending > 2005 {
				t.Errorf("Stats while failing = %+v, want LastError %v and 2004 pending", st, tc.wantErr)
			}
			if !logs.contains("keeping them to retry") {
				t.Errorf("write error not logged:\n%s", logs.String())
			}

			restore()
			waitFor(t, 5*time.Second, "pending changes to be written", func() bool { return s.Stats().Pending == 0 })
			st = s.Stats()
			if st.LastError != nil || st.LastWrite.IsZero() {
				t.Errorf("Stats after recovery = %+v", st)
			}
			if !logs.contains("works again") {
				t.Errorf("recovery not logged:\n%s", logs.String())
			}

			got := reopenLoad(t, s, path, o)
			local := got["local"]
			if len(local.Records) != 2000 || string(local.Records["key-0000"]) != "newer" ||
				!bytes.Equal(local.Records["key-1999"], big) || local.Records["before"] != nil {
				t.Errorf("after recovery: %d records, key-0000=%q, before=%q", len(local.Records), local.Records["key-0000"], local.Records["before"])
			}
			if got["peer"].Meta.ClusterID != "peer" || got["peer"].Meta.Records != 1 {
				t.Errorf("peer = %+v", got["peer"].Meta)
			}
		})
	}
}

// TestCloseWhileWritesFail: Close does not hang or panic when the final
// commit fails; it reports the error and says what was not written.
func TestCloseWhileWritesFail(t *testing.T) {
	var logs logBuf
	path := dbPath(t)
	s, _ := mustOpen(t, path, testOptions(&logs))
	capSize(t, s)
	for i := 0; i < 2000; i++ {
		s.Put("local", fmt.Sprint(i), bytes.Repeat([]byte("x"), 1000))
	}
	done := make(chan error)
	go func() { done <- s.Close() }()
	select {
	case err := <-done:
		if !errors.Is(err, berrors.ErrMaxSizeReached) {
			t.Errorf("Close = %v, want ErrMaxSizeReached", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Close hung while writes fail")
	}
	if !logs.contains("with 2000 changes not written") {
		t.Errorf("lost changes not logged:\n%s", logs.String())
	}
}

func TestBackoff(t *testing.T) {
	s := &Store{opts: Options{BatchInterval: 100 * time.Millisecond, MaxRetryInterval: time.Second}.withDefaults()}
	for _, tc := range []struct {
		failures int
		want     time.Duration
	}{
		{1, 100 * time.Millisecond},
		{2, 200 * time.Millisecond},
		{3, 400 * time.Millisecond},
		{4, 800 * time.Millisecond},
		{5, time.Second},
		{1000, time.Second},
	} {
		if got := s.backoff(tc.failures); got != tc.want {
			t.Errorf("backoff(%d) = %s, want %s", tc.failures, got, tc.want)
		}
	}
}
