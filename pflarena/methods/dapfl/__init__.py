"""Dap-FL: its parameters (:mod:`.params`)."""
