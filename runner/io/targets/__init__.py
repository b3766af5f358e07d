"""Target adapters (issue 17): the HTTP target (:mod:`.http`), its wire protocol and
failure classification (:mod:`.protocol`), the reference server (:mod:`.server`), and
how a command line's ``--target`` becomes an adapter (:mod:`.compose`).  The synthetic
SQLite target is ``runner.io.synthetic_target``."""
