"""The request contract's build tooling: it reads the installed TRL, transformers and PEFT and writes
what schemas/ checks in (schemas/trl_contract.json, schemas/trl_fields.py, the JSON Schemas) and
the generated docs. Run by hand, by `.ci/canary` and by the drift tests; never at run time, so
neither the daemon nor a job's child imports it.
"""
