"""CPU kernels: the tables the runtime binds a plan's nodes with, and the numba loops behind them.

Layout (each module imports only those above it in this list, so there are no import cycles):

* ``operands.py`` - what an op's operands mean for every backend (rules, unpacking, geometry,
  optimizer and EMA ranges, activation codes); the GPU table uses it too. No numba.
* ``status.py`` - the gather kernels' status codes and the errors they stand for.
* ``base.py`` - ``BindEnv``, the factory types, ``registrar`` and ``join_tables``.
* ``philox.py`` - the numba loops of the Philox generator (train/rng.py is its API).
* ``fused.py``, ``blas.py`` - fused one-pass numba loops; the sgemm binding and its bands.
* ``passes.py`` - the bias+activation and activation-gradient passes around a GEMM.
* ``conv_loops.py`` - the numba loops of convolution, batch norm and pooling;
  ``conv_par.py`` and ``conv_tiled.py`` - their threaded and tiled variants.
* ``augment.py`` - the numba loops of the image transfer (data/augment.py is its API).
* ``conv.py``, ``transfer.py`` - kernel factories: CONV_KERNELS, TRANSFER_KERNELS.
* ``cpu.py`` - the dense kernel factories, and KERNELS: every module's table joined.

Nothing is imported here: ``import renaissance_nb.kernels.philox`` loads only what it needs.
"""
