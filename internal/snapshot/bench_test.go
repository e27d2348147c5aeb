package snapshot

import (
	"fmt"
	"path/filepath"
	"testing"
	"time"
)

// benchValue is about the size of an encoded endpoint record.
func benchValue(i int) []byte {
	return fmt.Appendf(nil, `{"ns":"team-%03d","svc":"service-%05d","ip":"10.%d.%d.%d","port":8080,"host":"pod-%05d","ready":true,"x":"%016x"}`,
		i%100, i, i>>16&255, i>>8&255, i&255, i, i)[:120]
}

func benchKey(i int) string { return fmt.Sprintf("team-%03d/service-%05d/pod-%05d", i%100, i/3, i) }

// writeBenchStore writes n records spread over 3 sources and closes it.
func writeBenchStore(b *testing.B, path string, n int) {
	b.Helper()
	s, _, err := Open(path, Options{Logf: b.Logf})
	if err != nil {
		b.Fatal(err)
	}
	sources := []string{"local", "peer-a", "peer-b"}
	recs := make([]map[string][]byte, len(sources))
	for i := range recs {
		recs[i] = make(map[string][]byte)
	}
	for i := 0; i < n; i++ {
		recs[i%len(sources)][benchKey(i)] = benchValue(i)
	}
	for i, name := range sources {
		s.ReplaceSource(name, recs[i], Meta{ClusterID: name, LastContact: time.Now()})
	}
	if err := s.Close(); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkLoad100k: Load of 100,000 records of 120 bytes across 3 sources
// (the start-up path; target well under 300ms).
func BenchmarkLoad100k(b *testing.B) {
	path := filepath.Join(b.TempDir(), "mcs.db")
	writeBenchStore(b, path, 100_000)
	s, _, err := Open(path, Options{Logf: b.Logf})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	b.ReportAllocs()
	for b.Loop() {
		got, err := s.Load()
		if err != nil {
			b.Fatal(err)
		}
		if n := got["local"].Meta.Records + got["peer-a"].Meta.Records + got["peer-b"].Meta.Records; n != 100_000 {
			b.Fatalf("loaded %d records", n)
		}
	}
}

// BenchmarkOpenAndLoad100k is the whole start-up: Open (with its checks of
// the file) and Load.
func BenchmarkOpenAndLoad100k(b *testing.B) {
	path := filepath.Join(b.TempDir(), "mcs.db")
	writeBenchStore(b, path, 100_000)
	b.ReportAllocs()
	for b.Loop() {
		s, res, err := Open(path, Options{Logf: b.Logf})
		if err != nil || res.Created {
			b.Fatal(err, res)
		}
		if _, err := s.Load(); err != nil {
			b.Fatal(err)
		}
		if err := s.Close(); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCommit10kPuts: one batch of 10,000 Puts (changed values) into a
// store of 100,000 records, committed with Flush (one Update and fsync).
func BenchmarkCommit10kPuts(b *testing.B) {
	path := filepath.Join(b.TempDir(), "mcs.db")
	writeBenchStore(b, path, 100_000)
	s, _, err := Open(path, Options{BatchInterval: time.Hour, Logf: b.Logf})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	round := 0
	b.ReportAllocs()
	for b.Loop() {
		round++
		for i := 0; i < 10_000; i++ {
			v := benchValue(i * 10)
			v[len(v)-1] = byte(round)
			s.Put("local", benchKey(i*10), v)
		}
		if err := s.Flush(); err != nil {
			b.Fatal(err)
		}
	}
	if st := s.Stats(); st.WriteErrors != 0 {
		b.Fatalf("Stats = %+v", st)
	}
}

// BenchmarkReplaceSource33k: a reconnect's full list replacing a source of
// about 33,000 records in which 1% changed.
func BenchmarkReplaceSource33k(b *testing.B) {
	path := filepath.Join(b.TempDir(), "mcs.db")
	writeBenchStore(b, path, 100_000)
	s, _, err := Open(path, Options{BatchInterval: time.Hour, Logf: b.Logf})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	recs := make(map[string][]byte)
	for i := 0; i < 100_000; i += 3 {
		recs[benchKey(i)] = benchValue(i)
	}
	round := 0
	b.ReportAllocs()
	for b.Loop() {
		round++
		for i := 0; i < 100_000; i += 300 {
			v := benchValue(i)
			v[len(v)-1] = byte(round)
			recs[benchKey(i)] = v
		}
		s.ReplaceSource("local", recs, Meta{ClusterID: "local", LastFullSync: time.Now()})
		if err := s.Flush(); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkPut is the caller's cost of one Put (no disk involved).
func BenchmarkPut(b *testing.B) {
	s, _, err := Open(filepath.Join(b.TempDir(), "mcs.db"), Options{BatchInterval: time.Hour, Logf: b.Logf})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	v := benchValue(1)
	i := 0
	b.ReportAllocs()
	for b.Loop() {
		s.Put("local", benchKey(i%100_000), v)
		i++
	}
}
