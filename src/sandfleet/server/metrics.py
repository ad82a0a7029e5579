"""The service's Prometheus metrics, each prefixed ``sandfleet_``, in a registry of its own."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10,
                   30, 60, 300)


class Metrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry(auto_describe=True)
        self.sandboxes = Gauge("sandfleet_sandboxes", "Live sandboxes.", registry=r)
        self.busy = Gauge("sandfleet_sandboxes_busy", "Commands running now (admitted under --max-busy).", registry=r)
        self.queued_now = Gauge("sandfleet_admission_waiting", "Requests waiting for admission now.", ["gate"],
                                registry=r)
        self.create_seconds = Histogram("sandfleet_create_seconds", "Sandbox creation time (admission excluded).",
                                        buckets=LATENCY_BUCKETS, registry=r)
        self.exec_seconds = Histogram("sandfleet_exec_seconds", "Command run time, request to exit record.",
                                      buckets=LATENCY_BUCKETS, registry=r)
        self.queued = Counter("sandfleet_admissions_queued", "Requests that waited for admission.", ["gate"],
                              registry=r)
        self.rejected = Counter("sandfleet_admissions_rejected",
                                "Requests refused with 429 (admission deadline passed, or quota).", ["gate"],
                                registry=r)
        self.reaped = Counter("sandfleet_reaped_leftovers", "Leftovers of a killed predecessor reaped at start.",
                              registry=r)
        self.expired = Counter("sandfleet_sandboxes_expired", "Sandboxes closed at their TTL.", registry=r)
        self.close_failures = Counter("sandfleet_close_failures", "Sandbox closes that failed (logged with the id).",
                                      registry=r)
        self.bytes_in = Counter("sandfleet_bytes_in", "Request body bytes received.", registry=r)
        self.bytes_out = Counter("sandfleet_bytes_out", "Response body bytes sent.", registry=r)
        self.requests = Counter("sandfleet_http_requests", "HTTP requests answered, by status class.", ["status"],
                                registry=r)
        self.task_uploads = Counter("sandfleet_task_image_uploads", "Task folders uploaded (PUT /v1/task-images).",
                                    registry=r)
        self.task_builds = Counter("sandfleet_task_image_builds",
                                   "Task image builds for uploaded folders: built, cached (found built), failed.",
                                   ["result"], registry=r)
        for result in ("built", "cached", "failed"):
            self.task_builds.labels(result)
        for gate in ("sandboxes", "busy", "quota"):
            self.queued.labels(gate)
            self.rejected.labels(gate)
        for gate in ("sandboxes", "busy"):
            self.queued_now.labels(gate)

    def render(self) -> bytes:
        return generate_latest(self.registry)
