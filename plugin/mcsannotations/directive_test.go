package mcsannotations

import (
	"slices"
	"strings"
	"testing"
)

func TestInsertDirective(t *testing.T) {
	in := []string{"cache", "hosts", "kubernetes", "forward"}
	got, err := InsertDirective(in)
	if err != nil || !slices.Equal(got, []string{"cache", "hosts", "mcsannotations", "kubernetes", "forward"}) {
		t.Fatalf("got %v, %v", got, err)
	}
	if !slices.Equal(in, []string{"cache", "hosts", "kubernetes", "forward"}) {
		t.Fatal("input modified")
	}
	if _, err := InsertDirective([]string{"cache", "forward"}); err == nil || !strings.Contains(err.Error(), `anchor directive "kubernetes" not found`) {
		t.Fatalf("missing anchor: %v", err)
	}
	if _, err := InsertDirective(got); err == nil || !strings.Contains(err.Error(), "already registered") {
		t.Fatalf("twice: %v", err)
	}
}
