package archtest

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// TestReadmeCorpusCount keeps the README honest: the number of
// conformance cases it quotes is the number in testdata/conformance.
func TestReadmeCorpusCount(t *testing.T) {
	files, err := filepath.Glob("../../testdata/conformance/*/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no corpus files: %v", err)
	}
	cases := 0
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(line, "- name:") {
				cases++
			}
		}
	}
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	quoted := regexp.MustCompile(`conformance corpora \((\d+) cases`).FindAllStringSubmatch(string(readme), -1)
	if len(quoted) == 0 {
		t.Fatal(`the README no longer says "The conformance corpora (N cases": keep a count there, or update this test`)
	}
	for _, q := range quoted {
		if n, _ := strconv.Atoi(q[1]); n != cases {
			t.Errorf("the README says the conformance corpora have %d cases; testdata/conformance has %d", n, cases)
		}
	}
}

// TestReadmeLinksStayInTheRepository: what users rely on is documented in
// the repository itself.
func TestReadmeLinksStayInTheRepository(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range regexp.MustCompile(`\]\(([^)]+)\)`).FindAllStringSubmatch(string(readme), -1) {
		link := m[1]
		if strings.HasPrefix(link, "http") || strings.HasPrefix(link, "#") {
			continue
		}
		if strings.HasPrefix(link, "..") {
			t.Errorf("README links outside the repository: %s", link)
			continue
		}
		if _, err := os.Stat(filepath.Join("../..", link)); err != nil {
			t.Errorf("README links to %s, which is not in the repository", link)
		}
	}
}
