package telemetry

import (
	"strings"
	"testing"
)

func TestClient(t *testing.T) {
	env := func(kv ...string) func(string) string {
		return func(k string) string {
			for i := 0; i+1 < len(kv); i += 2 {
				if kv[i] == k {
					return kv[i+1]
				}
			}
			return ""
		}
	}
	for _, tc := range []struct {
		name    string
		o       Options
		env     func(string) string
		want    bool // a client
		wantErr string
		hp      string
	}{
		{name: "nothing configured", env: env()},
		{name: "grpc flag", o: Options{Endpoint: "127.0.0.1:4317", Protocol: "grpc"}, env: env(), want: true, hp: "127.0.0.1:4317"},
		{name: "http URL", o: Options{Endpoint: "http://127.0.0.1:4318/"}, env: env(), want: true, hp: "127.0.0.1:4318"},
		{name: "environment", env: env("OTEL_EXPORTER_OTLP_ENDPOINT", "https://collector.example:4318"), want: true, hp: "collector.example:4318"},
		{name: "turned off", env: env("OTEL_TRACES_EXPORTER", "none", "OTEL_EXPORTER_OTLP_ENDPOINT", "http://x:4318")},
		{name: "otlp alone: the exporter's default", env: env("OTEL_TRACES_EXPORTER", "otlp"), want: true},
		{name: "bad protocol", o: Options{Endpoint: "x:1", Protocol: "carrier-pigeon"}, env: env(), wantErr: "carrier-pigeon"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Client(tc.o, tc.env)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if (c != nil) != tc.want {
				t.Errorf("client %v, want one: %v", c, tc.want)
			}
			if hp := EndpointHostPort(tc.o, tc.env); hp != tc.hp {
				t.Errorf("EndpointHostPort = %q, want %q", hp, tc.hp)
			}
		})
	}
}
