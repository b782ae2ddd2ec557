"""Tandem's widgets: the main window, chat tabs, sidebar, sampler panel, attachments (and the compare view and
model manager). Widgets talk to `app.store` and `app.service` only through their public API; the GUI thread
never runs a forward pass — answers arrive with `async for result in job` on the qasync loop."""
