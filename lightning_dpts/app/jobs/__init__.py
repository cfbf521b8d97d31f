"""The jobs ``dpts`` runs, each a short composition of the shared modules; nothing but the command line imports a job.

* :mod:`lightning_dpts.app.jobs.fit` - ``dpts fit``: train a private forecaster, evaluate it, write the run directory;
* :mod:`lightning_dpts.app.jobs.predict` - ``dpts predict``: forecast new data with a model ``dpts fit`` exported;
* :mod:`lightning_dpts.app.jobs.synth` - ``dpts synth``: release a DP synthetic dataset by Private Evolution.

What they share lives outside this package: the options (:mod:`lightning_dpts.app.config`), data loading
(:mod:`lightning_dpts.data.loading`), the model factory (:mod:`lightning_dpts.app.forecasters`), the training
geometry (:mod:`lightning_dpts.app.geometry`), the budget (:mod:`lightning_dpts.app.budget`), scoring
(:mod:`lightning_dpts.app.scoring`), reports (:mod:`lightning_dpts.app.reporting`), model export
(:mod:`lightning_dpts.app.export`) and the run directory (:mod:`lightning_dpts.outputs`). Import a job's module
directly (``from lightning_dpts.app.jobs.fit import run_fit``).
"""
