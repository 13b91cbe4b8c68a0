package apiserver

import (
	"encoding/json"
	"reflect"
	"sort"
	"strconv"
	"strings"
)

// jsonPatch is an RFC 6902 patch that turns before into after: what a
// mutating admission plugin changed. Objects are diffed key by key, lists
// of equal length item by item; anything else is replaced whole.
func jsonPatch(before, after []byte) string {
	var a, b any
	if json.Unmarshal(before, &a) != nil || json.Unmarshal(after, &b) != nil {
		return ""
	}
	var ops []map[string]any
	diffJSON("", a, b, &ops)
	out, err := json.Marshal(ops)
	if err != nil {
		return ""
	}
	return string(out)
}

func diffJSON(path string, a, b any, ops *[]map[string]any) {
	if reflect.DeepEqual(a, b) {
		return
	}
	switch av := a.(type) {
	case map[string]any:
		bv, ok := b.(map[string]any)
		if !ok {
			break
		}
		keys := make([]string, 0, len(av)+len(bv))
		for k := range av {
			keys = append(keys, k)
		}
		for k := range bv {
			if _, ok := av[k]; !ok {
				keys = append(keys, k)
			}
		}
		sort.Strings(keys)
		for _, k := range keys {
			p := path + "/" + pointerEscape(k)
			x, inA := av[k]
			y, inB := bv[k]
			switch {
			case !inB:
				*ops = append(*ops, map[string]any{"op": "remove", "path": p})
			case !inA:
				*ops = append(*ops, map[string]any{"op": "add", "path": p, "value": y})
			default:
				diffJSON(p, x, y, ops)
			}
		}
		return
	case []any:
		bv, ok := b.([]any)
		if !ok || len(av) != len(bv) {
			break
		}
		for i := range av {
			diffJSON(path+"/"+strconv.Itoa(i), av[i], bv[i], ops)
		}
		return
	}
	*ops = append(*ops, map[string]any{"op": "replace", "path": path, "value": b})
}

func pointerEscape(s string) string {
	return strings.ReplaceAll(strings.ReplaceAll(s, "~", "~0"), "/", "~1")
}
