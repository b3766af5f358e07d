"""Units of work the runner loop runs: dispatch and reconcile, the poll pass, the
lifecycle sweep, pipeline workers and jobs.  Each talks to ports, never to drivers."""
