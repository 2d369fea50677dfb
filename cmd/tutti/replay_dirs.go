package main

import "strings"

// shellJoin joins args for the report's reproduce line, single-quoting those
// a shell would split or expand (a --storage-label with spaces).
func shellJoin(args []string) string {
	out := make([]string, len(args))
	for i, a := range args {
		if a == "" || strings.ContainsAny(a, " \t\n'\"$`\\*?[]()<>|&;#~{}") {
			a = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
		}
		out[i] = a
	}
	return strings.Join(out, " ")
}
