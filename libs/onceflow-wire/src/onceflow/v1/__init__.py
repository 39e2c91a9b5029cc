"""onceflow's wire contracts, generated from proto/onceflow/v1/*.proto by proto/generate.sh
(`make proto`). Only this file is kept in git; the modules beside it are build output."""
