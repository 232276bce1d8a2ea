"""What operators see: metrics (one module, two exporters), optional traces, and Grafana dashboards."""
