"""FedRep: its parameters (:mod:`.params`)."""
