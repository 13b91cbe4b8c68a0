package archtest

import (
	"encoding/json"
	"io"
	"os/exec"
	"strings"
	"testing"
)

type pkg struct {
	ImportPath string
	Doc        string
	Imports    []string
	Deps       []string
	Name       string
}

const mod = "github.com/kproxy/kproxy/"

func listPackages(t *testing.T) []pkg {
	t.Helper()
	cmd := exec.Command("go", "list", "-json=ImportPath,Doc,Imports,Deps,Name", mod+"...")
	cmd.Dir = "../.."
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var pkgs []pkg
	d := json.NewDecoder(out)
	for {
		var p pkg
		if err := d.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		pkgs = append(pkgs, p)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatal(err)
	}
	if len(pkgs) < 5 {
		t.Fatalf("go list found only %d packages", len(pkgs))
	}
	return pkgs
}

func TestEveryPackageHasADocComment(t *testing.T) {
	for _, p := range listPackages(t) {
		if strings.TrimSpace(p.Doc) == "" {
			t.Errorf("%s has no package doc comment", p.ImportPath)
		}
	}
}

func TestImportDirection(t *testing.T) {
	forbidden := map[string][]string{
		mod + "internal/decode": {mod + "internal/proxy", mod + "internal/tui", mod + "internal/serve"},
		mod + "internal/stages": {mod + "internal/proxy", mod + "internal/tui", mod + "internal/serve"},
		mod + "internal/record": {mod + "internal/proxy", mod + "internal/tui", mod + "internal/stages", mod + "internal/serve"},
		mod + "internal/tui":    {mod + "internal/proxy", mod + "internal/stages", mod + "internal/serve"},
		// What consumes or produces records for the views and the CI mode
		// works on records only: never the proxy, the replay or the wiring.
		mod + "internal/filter":       {mod + "internal/proxy", mod + "internal/stages", mod + "internal/serve", mod + "internal/tui"},
		mod + "internal/flowapi":      {mod + "internal/proxy", mod + "internal/stages", mod + "internal/serve", mod + "internal/tui"},
		mod + "internal/source":       {mod + "internal/proxy", mod + "internal/stages", mod + "internal/serve", mod + "internal/tui"},
		mod + "internal/flowview":     {mod + "internal/proxy", mod + "internal/stages", mod + "internal/serve", mod + "internal/tui"},
		mod + "internal/servertrace":  {mod + "internal/proxy", mod + "internal/stages", mod + "internal/serve", mod + "internal/tui"},
		mod + "internal/auditlatency": {mod + "internal/proxy", mod + "internal/stages", mod + "internal/serve", mod + "internal/tui"},
	}
	for _, p := range listPackages(t) {
		for prefix, bad := range forbidden {
			if p.ImportPath != prefix && !strings.HasPrefix(p.ImportPath, prefix+"/") {
				continue
			}
			for _, d := range p.Deps {
				for _, b := range bad {
					if d == b || strings.HasPrefix(d, b+"/") {
						t.Errorf("%s depends on %s", p.ImportPath, d)
					}
				}
			}
		}
	}
}

// TestKubernetesImportsConfinedToReplay keeps k8s.io/kubernetes (the
// apiserver's internals) inside the replay code.
func TestKubernetesImportsConfinedToReplay(t *testing.T) {
	allowed := []string{mod + "internal/stages", mod + "internal/tools"}
	for _, p := range listPackages(t) {
		ok := false
		for _, a := range allowed {
			if p.ImportPath == a || strings.HasPrefix(p.ImportPath, a+"/") {
				ok = true
			}
		}
		if ok {
			continue
		}
		for _, imp := range p.Imports {
			if strings.HasPrefix(imp, "k8s.io/kubernetes/") {
				t.Errorf("%s imports %s: only the replay (internal/stages) may", p.ImportPath, imp)
			}
		}
	}
}
