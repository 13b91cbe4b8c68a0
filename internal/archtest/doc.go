// Package archtest checks the shape of the code base: every package has a
// doc comment, the import direction holds (decode and stages never import
// proxy or tui; the TUI consumes records only), and k8s.io/kubernetes is
// imported only by the replay.
package archtest
