"""FedPG: its parameters (:mod:`.params`)."""
