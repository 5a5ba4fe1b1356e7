"""`sflow dashboard`: a live web page over a run's analytics store.

- `panels`: what each panel shows, one function of store SQL per panel (plain JSON data).
- `app`: `create_app(config)`, the FastAPI server of the page (`static/`) and the JSON it polls.
- `config`: `DashboardConfig` (port, refresh, the `AnalyticsConfig` of the store to read).
"""
