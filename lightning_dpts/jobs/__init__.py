"""The jobs ``dpts`` runs, each a short composition of the shared modules; nothing but the command line imports a job.

* :mod:`lightning_dpts.jobs.fit` - ``dpts fit``: train a private forecaster, evaluate it, write the run directory;
* :mod:`lightning_dpts.jobs.predict` - ``dpts predict``: forecast new data with a model ``dpts fit`` exported;
* :mod:`lightning_dpts.jobs.synth` - ``dpts synth``: release a DP synthetic dataset by Private Evolution.

What they share lives outside this package: the options (:mod:`lightning_dpts.config`), data loading
(:mod:`lightning_dpts.loading`), the model factory (:mod:`lightning_dpts.forecasters`), the training geometry
(:mod:`lightning_dpts.geometry`), the budget (:mod:`lightning_dpts.budget`), scoring (:mod:`lightning_dpts.scoring`),
reports (:mod:`lightning_dpts.reporting`), model export (:mod:`lightning_dpts.export`) and the run directory
(:mod:`lightning_dpts.outputs`). Import a job's module directly (``from lightning_dpts.jobs.fit import run_fit``).
"""
