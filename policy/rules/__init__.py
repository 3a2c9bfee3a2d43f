"""The rules DSL: the policy file's schema, its compiler (YAML + CEL, every problem located),
the evaluator (first matching rule wins), static CEL references and size limits."""
