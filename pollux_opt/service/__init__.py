"""The scheduler as a long-running service: ``pollux-opt serve`` and its clients.

:mod:`~pollux_opt.service.server` runs the scheduler loop over an open queue
of jobs (:func:`~pollux_opt.service.server.serve`), :mod:`~pollux_opt.service.db`
keeps the queue and an index of the event log in SQLite,
:mod:`~pollux_opt.service.app` answers the HTTP API and
:mod:`~pollux_opt.service.metrics` its Prometheus metrics,
:mod:`~pollux_opt.service.dashboard` serves the page at ``/`` (its files in
``static/``, its charts drawn by :mod:`~pollux_opt.service.charts`), and
:mod:`~pollux_opt.service.client` is the command line's client.  The web stack
is the ``service`` extra, imported only when a service or client runs;
``docs/service.md`` describes the API, the states and the trust model.
"""
