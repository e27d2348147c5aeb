package main

import "fmt"

// insertBefore returns a copy of directives with name placed just before anchor.
// It fails when anchor is missing, so that a CoreDNS upgrade that renames or
// removes the anchor breaks the build loudly instead of misordering the chain.
func insertBefore(directives []string, name, anchor string) ([]string, error) {
	out := make([]string, 0, len(directives)+1)
	found := false
	for _, d := range directives {
		if d == name {
			return nil, fmt.Errorf("directive %q is already registered", name)
		}
		if d == anchor {
			out = append(out, name)
			found = true
		}
		out = append(out, d)
	}
	if !found {
		return nil, fmt.Errorf("anchor directive %q not found: cannot place %q", anchor, name)
	}
	return out, nil
}
