package io.stratalog.spark;

/**
 * A planner already running in the PySpark driver process (registered there by
 * {@code stratalog.spark.session.get_session}): it answers the same JSON requests as
 * {@code python -m stratalog.spark.jvm_plan} without starting an interpreter per query.
 */
public interface PlanService {
  String answer(String request);
}
