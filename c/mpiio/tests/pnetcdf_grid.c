/* PnetCDF, unmodified: a netCDF file with one 2-D int variable of 8p x 10, rank r putting
 * rows 8r..8r+7 with ncmpi_put_vara_int_all, then (reopened read-only) getting the column
 * block r*10/p.. with ncmpi_get_vara_int_all and checking it. Value at (i, j) is
 * i*100+j. The file is checked afterwards with ncmpidump.
 *   mpirun -np 2 ./pnetcdf_grid FILE */
#include <mpi.h>
#include <pnetcdf.h>
#include <stdio.h>
#include <stdlib.h>

#define COLS 10

static void check(int rc, const char *what)
{
    if (rc != NC_NOERR) {
        fprintf(stderr, "pnetcdf_grid: %s: %s\n", what, ncmpi_strerror(rc));
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int r, p, nc, dim[2], var;
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    MPI_Comm_size(MPI_COMM_WORLD, &p);
    if (argc < 2) {
        fprintf(stderr, "usage: pnetcdf_grid FILE\n");
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    MPI_Offset rows = 8 * (MPI_Offset)p;
    check(ncmpi_create(MPI_COMM_WORLD, argv[1], NC_CLOBBER | NC_64BIT_DATA, MPI_INFO_NULL, &nc), "create");
    check(ncmpi_def_dim(nc, "y", rows, &dim[0]), "def_dim y");
    check(ncmpi_def_dim(nc, "x", COLS, &dim[1]), "def_dim x");
    check(ncmpi_def_var(nc, "grid", NC_INT, 2, dim, &var), "def_var");
    check(ncmpi_put_att_text(nc, NC_GLOBAL, "title", 5, "ferry"), "put_att");
    check(ncmpi_enddef(nc), "enddef");
    int block[8][COLS];
    for (int i = 0; i < 8; i++)
        for (int j = 0; j < COLS; j++)
            block[i][j] = (8 * r + i) * 100 + j;
    MPI_Offset start[2] = {8 * (MPI_Offset)r, 0}, count[2] = {8, COLS};
    check(ncmpi_put_vara_int_all(nc, var, start, count, &block[0][0]), "put_vara_int_all");
    check(ncmpi_close(nc), "close");

    check(ncmpi_open(MPI_COMM_WORLD, argv[1], NC_NOWRITE, MPI_INFO_NULL, &nc), "open");
    check(ncmpi_inq_varid(nc, "grid", &var), "inq_varid");
    MPI_Offset c0 = COLS * r / p, nc_ = COLS * (r + 1) / p - c0;
    MPI_Offset rs[2] = {0, c0}, rc[2] = {rows, nc_};
    int *got = calloc((size_t)(rows * nc_), sizeof *got);
    check(ncmpi_get_vara_int_all(nc, var, rs, rc, got), "get_vara_int_all");
    int bad = 0;
    for (MPI_Offset i = 0; i < rows; i++)
        for (MPI_Offset j = 0; j < nc_; j++)
            if (got[i * nc_ + j] != (int)(i * 100 + c0 + j))
                bad = 1;
    free(got);
    check(ncmpi_close(nc), "close");
    int any;
    MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (any && r == 0)
        fprintf(stderr, "pnetcdf_grid: get_vara_int_all returned other ints\n");
    if (!any && r == 0)
        printf("pnetcdf_grid: ok, %d ranks\n", p);
    MPI_Finalize();
    return any ? 5 : 0;
}
