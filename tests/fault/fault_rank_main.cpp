// fault_rank SCENARIO VICTIM SEED REPORT_DIR: one rank of a fault scenario (fault_rank.cpp), as
// a program, for running a case by hand; the suite's driver loads the same code into its ranks.
extern "C" int shardtensor_fault_rank_main(int argc, char** argv);

int main(int argc, char** argv) { return shardtensor_fault_rank_main(argc, argv); }
