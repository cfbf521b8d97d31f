"""The ``dpts`` application: the command line (:mod:`lightning_dpts.app.cli`), its jobs
(:mod:`lightning_dpts.app.jobs`: ``fit``, ``predict``, ``synth``) and their helpers (configuration, budget,
geometry, reporting, export, plots, resume, console).

Built on the plugin (:mod:`lightning_dpts.privacy`, :mod:`~lightning_dpts.data`, :mod:`~lightning_dpts.training`,
:mod:`~lightning_dpts.models`, :mod:`~lightning_dpts.release`, :mod:`~lightning_dpts.synthetic`,
:mod:`~lightning_dpts.audit`); nothing in the plugin imports this package (docs/architecture.md). A Lightning user
does not need it: import the plugin's modules instead.
"""
