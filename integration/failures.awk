# Prints each failed test of a `go test -v` log with the lines it printed:
# go test -v streams a test's output after its "=== RUN" (or "=== CONT",
# when parallel tests interleave) and ends it with "--- FAIL" or "--- PASS".
# At most the last 60 lines of each.
/^=== (RUN|CONT|NAME) / { cur = $3; next }
/^=== PAUSE / { next }
/^ *--- FAIL: / {
	print
	n = split(out[$3], lines, "\n")
	for (i = (n > 61 ? n - 60 : 1); i < n; i++) print "    " lines[i]
	delete out[$3]
	next
}
/^ *--- (PASS|SKIP): / { delete out[$3]; next }
cur != "" { out[cur] = out[cur] $0 "\n" }
