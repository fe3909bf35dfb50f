"""How a run is executed on one machine: Flower's simulation runtime in a process of its own
(:mod:`~pflarena.runtime.simulation`, Ray kept warm between runs by
:mod:`~pflarena.runtime.ray_backend`), or in one process without Ray
(:mod:`~pflarena.runtime.inprocess`); :mod:`~pflarena.runtime.launch` starts either, and the
``flwr run`` way on a private SuperLink. :mod:`~pflarena.runtime.appdir` lays out the Flower
App directory, :mod:`~pflarena.runtime.processes` handles the processes started."""
