package main

import (
	"bytes"
	"fmt"
	"os"

	"github.com/spf13/pflag"

	"github.com/kproxy/kproxy/internal/flowapi"
)

// defaultFlowAPI is where kproxy flows and kproxy tui look without a FILE
// or --connect: the default address of kproxy serve --api-listen.
const defaultFlowAPI = "http://127.0.0.1:7070"

// flowAPIFlags connect to a kproxy's flow API, with kubectl's names for a
// server's credentials. kproxy flows and kproxy tui share them.
type flowAPIFlags struct {
	connect, token, tokenFile string
	opts                      flowapi.ClientOptions
}

func (f *flowAPIFlags) addFlags(fs *pflag.FlagSet) {
	fs.StringVar(&f.connect, "connect", "", "the flow API of kproxy serve --api-listen (default "+defaultFlowAPI+" when no FILE is given)")
	fs.StringVar(&f.token, "token", "", "bearer token for the flow API (the one in kproxy serve's --api-token-file)")
	fs.StringVar(&f.tokenFile, "token-file", "", "read the flow API's bearer token from this file (keeps it out of the process list)")
	fs.StringVar(&f.opts.CAFile, "certificate-authority", "", "CA certificate (PEM) that verifies an https flow API, as kubectl --certificate-authority")
	fs.StringVar(&f.opts.CertFile, "client-certificate", "", "client certificate (PEM) for a flow API that asks for one, as kubectl --client-certificate")
	fs.StringVar(&f.opts.KeyFile, "client-key", "", "the client certificate's key, as kubectl --client-key")
}

// credentials reports whether any credential flag was given.
func (f *flowAPIFlags) credentials() bool {
	return f.token != "" || f.tokenFile != "" || f.opts.CAFile != "" || f.opts.CertFile != "" || f.opts.KeyFile != ""
}

func (f *flowAPIFlags) url() string {
	if f.connect == "" {
		return defaultFlowAPI
	}
	return f.connect
}

func (f *flowAPIFlags) client() (*flowapi.Client, error) {
	opts := f.opts
	opts.Token = f.token
	if f.tokenFile != "" {
		b, err := os.ReadFile(f.tokenFile)
		if err != nil {
			return nil, fmt.Errorf("--token-file: %w (give the file kproxy serve's --api-token-file reads)", err)
		}
		opts.Token = string(bytes.TrimSpace(b))
	}
	return flowapi.NewClient(f.url(), opts)
}
