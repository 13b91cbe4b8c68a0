// Package apimetrics turns off, for kproxy's process, the apiserver's
// own Prometheus metrics that the replay's code observes on every
// request: request counts, latencies and sizes, authentication and its
// token cache, authorization and its webhooks, APF's gauges and
// histograms, each admission plugin, field validation, the storage
// transformers and etcd reads. kproxy serves none of them (its metrics
// are its own kproxy_* ones, on their own registry), so each observation
// was CPU and garbage spent for nobody: about a twentieth of a replayed
// GET, more for a write, which passes some twenty admission plugins.
//
// They are turned off the way kube-apiserver's operators turn a metric
// off, --disabled-metrics (component-base's SetDisabledMetrics): a
// disabled metric is never created, so observing it costs a nil check.
// That must happen before the metric is registered, and some are
// registered by their packages' init (admission's, the storage
// transformers'). So it happens in this package's init: Go initializes
// packages, among those whose imports are ready, in the order of their
// import paths, and this one needs only component-base's metrics and
// sorts (github.com/kproxy/...) before every k8s.io package that
// registers one. The replay package imports it.
//
// No decision of the apiserver's reads a metric back, so the replay's
// verdicts do not change. TestReplayObservesNoApiserverMetric (e2e)
// replays a read, a write, a refusal and a list against the real
// apiserver and fails, naming it, on any apiserver metric that still
// changed: one a new Kubernetes version adds goes in the list below.
package apimetrics

import "k8s.io/component-base/metrics"

func init() { metrics.SetDisabledMetrics(Disabled) }

// Disabled names the metrics turned off, as kube-apiserver's
// --disabled-metrics would.
var Disabled = []string{
	// The endpoints' filters and handlers (endpoints/metrics,
	// endpoints/filters, handlers/metrics).
	"apiserver_request_total",
	"apiserver_request_duration_seconds",
	"apiserver_request_sli_duration_seconds",
	"apiserver_request_slo_duration_seconds",
	"apiserver_response_sizes",
	"apiserver_request_body_size_bytes",
	"apiserver_request_filter_duration_seconds",
	"apiserver_request_timestamp_comparison_time",
	"apiserver_selfrequest_total",
	"apiserver_longrunning_requests",
	"apiserver_registered_watchers",
	"apiserver_current_inflight_requests",
	"apiserver_request_aborts_total",
	"apiserver_request_post_timeout_total",
	"apiserver_request_terminations_total",
	"apiserver_watch_events_total",
	"apiserver_watch_events_sizes",
	"apiserver_watch_list_duration_seconds",
	"apiserver_tls_handshake_errors_total",
	"apiserver_audit_event_total",
	"apiserver_audit_requests_rejected_total",
	"field_validation_request_duration_seconds",
	"apiserver_validation_declarative_validation_mismatch_total",
	"apiserver_validation_declarative_validation_panic_total",
	"apiserver_validation_duplicate_validation_error_total",
	// Authentication, authorization and the token cache.
	"authenticated_user_requests",
	"authentication_attempts",
	"authentication_duration_seconds",
	"authorization_attempts_total",
	"authorization_duration_seconds",
	"apiserver_authorization_webhook_duration_seconds",
	"apiserver_authorization_webhook_evaluations_total",
	"apiserver_authorization_webhook_evaluations_fail_open_total",
	"apiserver_authorization_decisions_total",
	"apiserver_authorization_match_condition_evaluation_seconds",
	"apiserver_authorization_match_condition_evaluation_errors_total",
	"apiserver_authorization_match_condition_exclusions_total",
	"authentication_token_cache_request_duration_seconds",
	"authentication_token_cache_request_total",
	"authentication_token_cache_fetch_total",
	"authentication_token_cache_active_fetch_count",
	"apiserver_client_certificate_expiration_seconds",
	// API Priority and Fairness.
	"apiserver_flowcontrol_current_executing_requests",
	"apiserver_flowcontrol_current_executing_seats",
	"apiserver_flowcontrol_current_inqueue_requests",
	"apiserver_flowcontrol_current_inqueue_seats",
	"apiserver_flowcontrol_current_limit_seats",
	"apiserver_flowcontrol_current_r",
	"apiserver_flowcontrol_dispatch_r",
	"apiserver_flowcontrol_latest_s",
	"apiserver_flowcontrol_next_s_bounds",
	"apiserver_flowcontrol_next_discounted_s_bounds",
	"apiserver_flowcontrol_demand_seats",
	"apiserver_flowcontrol_demand_seats_average",
	"apiserver_flowcontrol_demand_seats_high_watermark",
	"apiserver_flowcontrol_demand_seats_smoothed",
	"apiserver_flowcontrol_demand_seats_stdev",
	"apiserver_flowcontrol_dispatched_requests_total",
	"apiserver_flowcontrol_lower_limit_seats",
	"apiserver_flowcontrol_nominal_limit_seats",
	"apiserver_flowcontrol_priority_level_request_utilization",
	"apiserver_flowcontrol_priority_level_seat_utilization",
	"apiserver_flowcontrol_read_vs_write_current_requests",
	"apiserver_flowcontrol_rejected_requests_total",
	"apiserver_flowcontrol_request_concurrency_in_use",
	"apiserver_flowcontrol_request_concurrency_limit",
	"apiserver_flowcontrol_request_dispatch_no_accommodation_total",
	"apiserver_flowcontrol_request_execution_seconds",
	"apiserver_flowcontrol_request_queue_length_after_enqueue",
	"apiserver_flowcontrol_request_wait_duration_seconds",
	"apiserver_flowcontrol_seat_fair_frac",
	"apiserver_flowcontrol_target_seats",
	"apiserver_flowcontrol_upper_limit_seats",
	"apiserver_flowcontrol_work_estimated_seats",
	"apiserver_flowcontrol_watch_count_samples",
	"apiserver_flowcontrol_epoch_advance_total",
	// Admission, its webhooks and policies, and CEL.
	"apiserver_admission_controller_admission_duration_seconds",
	"apiserver_admission_step_admission_duration_seconds",
	"apiserver_admission_step_admission_duration_seconds_summary",
	"apiserver_admission_webhook_admission_duration_seconds",
	"apiserver_admission_webhook_rejection_count",
	"apiserver_admission_webhook_request_total",
	"apiserver_admission_match_condition_evaluation_seconds",
	"apiserver_admission_match_condition_evaluation_errors_total",
	"apiserver_admission_match_condition_exclusions_total",
	"apiserver_validating_admission_policy_check_total",
	"apiserver_validating_admission_policy_check_duration_seconds",
	"apiserver_mutating_admission_policy_check_total",
	"apiserver_mutating_admission_policy_check_duration_seconds",
	"apiserver_webhooks_x509_insecure_sha1_total",
	"apiserver_webhooks_x509_missing_san_total",
	"apiserver_cel_compilation_duration_seconds",
	"apiserver_cel_evaluation_duration_seconds",
	"apiextensions_apiserver_validation_ratcheting_seconds",
	"pod_security_evaluations_total",
	"pod_security_exemptions_total",
	"pod_security_errors_total",
	// Storage: the etcd reads and the transformers.
	"etcd_request_duration_seconds",
	"etcd_requests_total",
	"etcd_request_errors_total",
	"apiserver_storage_transformation_duration_seconds",
	"apiserver_storage_transformation_operations_total",
	"apiserver_storage_envelope_transformation_cache_misses_total",
	"apiserver_storage_data_key_generation_duration_seconds",
	"apiserver_storage_data_key_generation_failures_total",
	"apiserver_storage_list_evaluated_objects_total",
	"apiserver_storage_list_fetched_objects_total",
	"apiserver_storage_list_returned_objects_total",
	"apiserver_storage_list_total",
	"apiserver_storage_list_duration_seconds",
	"apiserver_storage_size_bytes",
	"apiserver_envelope_encryption_dek_cache_fill_percent",
	"apiserver_envelope_encryption_key_id_hash_status_last_timestamp_seconds",
	"apiserver_envelope_encryption_kms_operations_latency_seconds",
}
