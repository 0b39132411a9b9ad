package ledger

import "testing"

func TestParseOutcome(t *testing.T) {
	for o := Created; o <= Unknown; o++ {
		if got, ok := ParseOutcome(o.String()); !ok || got != o {
			t.Errorf("ParseOutcome(%q) = %v, %v", o.String(), got, ok)
		}
	}
	if _, ok := ParseOutcome("invalid"); ok {
		t.Error("an unknown name parsed")
	}
}
