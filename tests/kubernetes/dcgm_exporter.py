"""NVIDIA's dcgm-exporter as far as gpupool reads it, for simulated GPUs: its /metrics page (utilisation and
framebuffer memory per GPU, labelled with the pod the device plugin gave each GPU to), served over HTTP on an
address the API server's pod proxy will reach. The only fake here is the hardware behind the numbers."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

LABELS = ["gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname", "DCGM_FI_DRIVER_VERSION", "container",
          "namespace", "pod"]  # fmt: skip
FRAMEBUFFER_MIB = 81559


@dataclass
class Gpu:
    index: int
    util_pct: int = 0
    fb_used_mib: int = 0
    pod: tuple[str, str] | None = None
    """(namespace, name) of the pod holding it."""


class Exporter(Collector):
    """One node's exporter: set `gpus[i]` fields, and the next scrape reads them."""

    def __init__(self, host: str, node: str, count: int, model: str = "NVIDIA H100 80GB HBM3") -> None:
        self.node = node
        self.model = model
        self.gpus = [Gpu(i) for i in range(count)]
        registry = CollectorRegistry()
        registry.register(self)

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = generate_latest(registry) if self.path == "/metrics" else b""
                self.send_response(200 if body else 404)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                """Quiet: the test's output is its assertions."""

        self._server = ThreadingHTTPServer((host, 0), Handler)
        self.port = int(self._server.server_address[1])
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def uuid(self, index: int) -> str:
        return f"GPU-{self.node}-{index:04d}"

    def collect(self) -> Iterator[Metric]:
        util = GaugeMetricFamily("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", labels=LABELS)
        used = GaugeMetricFamily("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", labels=LABELS)
        free = GaugeMetricFamily("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).", labels=LABELS)
        for g in self.gpus:
            held = ["main", *g.pod] if g.pod else ["", "", ""]
            labels = [str(g.index), self.uuid(g.index), f"00000000:{g.index + 7:02X}:00.0", f"nvidia{g.index}",
                      self.model, f"nvidia-dcgm-exporter-{self.node}", "550.54.15", *held]  # fmt: skip
            util.add_metric(labels, g.util_pct)
            used.add_metric(labels, g.fb_used_mib)
            free.add_metric(labels, FRAMEBUFFER_MIB - g.fb_used_mib)
        yield from (util, used, free)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
