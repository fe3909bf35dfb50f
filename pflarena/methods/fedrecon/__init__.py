"""FedRecon: its parameters (:mod:`.params`)."""
