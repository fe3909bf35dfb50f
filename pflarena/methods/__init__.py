"""The methods' own modules, one package per method (``methods/<name>/``): the parameters
of each method whose run-config rules go beyond their types and bounds
(``methods/<name>/params.py``).

A parameters module imports neither torch nor Flower, nor the strategies, the server or the
client (tests/test_layers.py checks each): the command validates a run config against it
before a run starts (:func:`pflarena.cli.options.validate_run`), found through the methods'
catalog (``strategies/catalog.json``). The method's strategy imports its parameters from
there.
"""
